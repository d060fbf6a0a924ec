"""The kit every wing that serves routes on ComfyUI's PromptServer uses, so that each answers on the same terms.

``replies`` (the JSON answer, the error JSON, the guard around every handler), ``access`` (who may call a guarded
route: loopback with a ``Host`` and ``Origin`` a browser could not have been made to send, the token, a peer's
secret), ``bodies`` (request bodies: bounded, typed), ``numbers`` (the one parser of numbers in queries and bodies)
and ``executors`` (the thread pools of reads and of long work).  It sits below the wings and imports only core:
``surface`` and ``sharing`` both build on it and never on each other.
"""
