"""What a soak run is made of: the tree's pack and workflow, the workload's shape, the targets and the limits."""

import os

from bench import harness


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # bench/
ROOT = os.path.dirname(HERE)
PACK_NAME = "memx_soak_nodes"
PACK_SOURCE = harness.pack_source(PACK_NAME)
WORKFLOW_PATH = harness.workflow_path("default_t2i")
CHECKPOINT_NAME = "memx_sd15_random.safetensors"
NET_CLASS_NAME = "MemxSoakNet"
MIB = 1024 ** 2

LEAK_MODES = ("strict", "report", "off")
WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS, WORKLOAD_RELEASE = "reuse", "new-leaks", "release"
WORKLOAD_PACK_KEEPS = "pack-keeps"
WORKLOADS = (WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS, WORKLOAD_RELEASE, WORKLOAD_PACK_KEEPS)
SERVERS = ("memx", "plain")
FREE_ALL = {"unload_models": True, "free_memory": True}
SLOTS = (("s0", "MemxSoakCachedLoader"), ("s1", "MemxSoakCachedLoader"), ("s2", "MemxSoakCachedLoader"),
         ("s3", "MemxSoakHookedLoader"), ("s4", "MemxSoakHookedLoader"), ("s5", "MemxSoakHookedLoader"))
PACK_LOADER_ID, PACK_SAMPLER_ID, CENSUS_ID = "101", "102", "901"
SAMPLER_NODE_ID = "3"
LATENCY_TARGET = 1.10
RSS_TARGET_MIB_PER_100 = 1.0
PERF_CHECK_MIN_PROMPTS = 200
HISTORY_POLL_S = 0.05
METRICS_UNAVAILABLE = 501
FINAL_RESERVE_S = 180.0   # of --timeout, kept for the final free, the census and stopping the servers

# The ``release`` workload (bench.soak.release): the release pack, its loaders (node class, name prefix) in the order
# the leak prompts take them, the node ids of its prompts, and the servers it runs side by side.
RELEASE_PACK_NAME = "memx_release_nodes"
RELEASE_PACK_SOURCE = harness.pack_source(RELEASE_PACK_NAME)
RELEASE_NET_CLASS_NAME = "MemxReleaseNet"
RELEASE_LOADERS = {"resolution": ("MemxReleaseResolutionLoader", "r"), "named": ("MemxReleaseNamedLoader", "n"),
                   "bounded": ("MemxReleaseBoundedLoader", "b"), "list": ("MemxReleaseListLoader", "l")}
RELEASE_LOADER_ID, RELEASE_RENDER_ID, RELEASE_SAVE_ID, RELEASE_CENSUS_ID = "1", "2", "3", "901"
RELEASE_SIDE = 64                   # image side of the named loaders' prompts, smallest resolution of the class cache
RELEASE_SERVERS = ("plain", "fixed", "off", "auto")
RELEASE_CACHE_SWITCH = "MEMX_RELEASE_NODES_CACHE"
RELEASE_LAG = 2                     # prompts at the end whose models ComfyUI may not have warned about yet
RELEASE_LATENCY_TARGET = 1.05
RELEASE_RSS_SLACK_MODELS = 2        # with release: RSS growth <= the fixed pack's + this many models' bytes
RELEASE_LEAK_RSS_FRACTION = 0.5     # without release: RSS growth >= this fraction of the leaked bytes
RELEASE_RSS_WINDOW = 5              # after-prompt RSS samples averaged (median) at each end of the growth window

# The ``pack-keeps`` workload (bench.soak.keeps): packs that keep (model, clip, vae) of ComfyUI's own checkpoint
# loader under a new key every prompt, the loaders the prompts take in turn (node class, the key's input name),
# the checkpoints (the one the packs load, the one the shared text encoder comes from), node ids, the servers.
KEEPS_PACK_NAME = "memx_keeps_nodes"
KEEPS_PACK_SOURCE = harness.pack_source(KEEPS_PACK_NAME)
KEEPS_CACHE_SWITCH = "MEMX_KEEPS_NODES_CACHE"
INSPIRE_PACK_NAME = "ComfyUI-Inspire-Pack"
KEEPS_LOADERS = {"dict": ("MemxKeepsCheckpointLoader", "key"), "lru": ("MemxKeepsLruCheckpointLoader", "key"),
                 "inspire": ("CheckpointLoaderSimpleShared //Inspire", "key_opt")}
KEEPS_PLAIN_LOADER = "dict"         # plain ComfyUI runs every prompt's loader as this one, with the caches off
INSPIRE_CKPT_SLOTS = 5              # Inspire-Pack's cache_settings.json: its "ckpt" LRU keeps 5 checkpoints
KEEPS_CHECKPOINT_NAME = "memx_keeps_small.safetensors"       # what the packs load: the small one without CLIP
KEEPS_TEXT_CHECKPOINT_NAME = "memx_keeps_text.safetensors"   # the shared text encoder's: the small one with CLIP
KEEPS_LOADER_ID, KEEPS_WITNESS_ID, KEEPS_TEXT_LOADER_ID, KEEPS_SAMPLER_ID = "11", "12", "4", "3"
KEEPS_DECODE_ID, KEEPS_SAVE_ID, KEEPS_CENSUS_ID = "8", "9", "901"
KEEPS_SERVERS = ("plain", "off", "auto")
KEEPS_RSS_WINDOW = 3                # after-free samples averaged (median) at each end of the growth window
KEEPS_RSS_SLACK_MODELS = 2          # with release: RSS growth <= plain's + this many models' bytes
KEEPS_KEPT_RSS_FRACTION = 0.5       # without release: RSS growth >= this fraction of the bytes the packs kept
