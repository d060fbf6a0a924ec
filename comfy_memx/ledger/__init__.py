"""Who loaded which model, and what happened to it: the weakref ledger and the accounting that feeds it.

``records`` (the ledger: one record per torch module, held by weakref only), ``attribution`` (which prompt, node
and custom-node package asked for a load) and ``accounting`` (turning what the model-management wrappers observe
into ledger updates and ``load``/``unload`` events).
"""

from comfy_memx.ledger import records  # noqa: F401  (registers STATE.ledger: any use of the ledger wing has it)
