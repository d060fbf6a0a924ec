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
WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS = "reuse", "new-leaks"
WORKLOADS = (WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS)
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
