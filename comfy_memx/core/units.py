"""How comfy_memx shows sizes to people: one formatter for log lines, reports and command output."""

MIB = 1024 ** 2
GIB = 1024 ** 3
UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(nbytes):
    """A size in binary units with one decimal: ``1536`` -> ``"1.5 KiB"``, ``0`` -> ``"0 B"``, None -> ``"?"``.

    Negative sizes (a difference) keep their sign.
    """
    if nbytes is None:
        return "?"
    value = float(nbytes)
    unit = UNITS[0]
    for unit in UNITS[:-1]:
        if abs(value) < 1024:
            break
        value /= 1024
    else:
        unit = UNITS[-1]
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
