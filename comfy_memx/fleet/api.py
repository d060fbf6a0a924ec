"""The fleet wing's door for the other wings: what a server itself serves of the fleet files.

* :func:`runbooks_page` -- the HTML runbook page every alert's ``runbook_url`` points at (``/memx/runbooks``).
"""

from comfy_memx.fleet import runbooks


def runbooks_page():
    """The runbooks as one HTML page (bytes), one heading per alert whose id is the alert's name in lower case."""
    return runbooks.page()
