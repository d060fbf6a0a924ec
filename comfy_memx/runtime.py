"""Process-wide state of comfy_memx: the active config, how it was activated, the ledger and the event log.

Kept in its own module (never in ``__main__``) so that the launcher, the startup hook and the patches all see one
copy.  :func:`reset` puts everything back to the inactive defaults (tests, ``disable()``).
"""

from comfy_memx import config as _config
from comfy_memx.events import EventLog
from comfy_memx.ledger import Ledger

config = _config.DEFAULT
source = None          # "launcher", "env", "auto" or "api" once bootstrapped
ledger = Ledger()
events = EventLog()


def configure(cfg, activation_source):
    """Install ``cfg`` as the active config and open the event log it names."""
    global config, source, events
    events.close()
    config = cfg
    source = activation_source
    events = EventLog(cfg.events)


def reset():
    """Forget all state: inactive default config, an empty ledger, no event log."""
    global config, source, ledger, events
    events.close()
    config, source, ledger, events = _config.DEFAULT, None, Ledger(), EventLog()
