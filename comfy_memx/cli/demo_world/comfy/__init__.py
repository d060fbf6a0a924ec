"""Stand-in for the ``comfy`` package of a ComfyUI tree (see tests/fake_comfy/README.md).

Its modules are the base's; a module only one version has (0.27.0's ``memory_management``, ``pinned_memory``) lives
in that version's ``version_layer/comfy``, which the package searches after its own folder."""
import os

import stand_in_version

__path__.append(os.path.join(stand_in_version.LAYER, "comfy"))
