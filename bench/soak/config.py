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
WORKLOADS = (WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS, WORKLOAD_RELEASE)
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
