"""What every stand-in version shares, laid out as a ComfyUI tree (run by ``extend``, never imported)."""
