"""``leaks.patterns.classify`` on chains through ComfyUI's own output cache: named as ComfyUI's cache, never as a
thread's local variable to drop (a search of a model that is merely cached for the next prompt, as a new user
saw on real ComfyUI 0.33.0)."""

from comfy_memx.leaks import patterns

WORKER_CACHE = ("thread 'Thread-1 (prompt_worker)' frame __main__.prompt_worker local 'e'.caches.outputs"
                ".cache[('4', 0)][0][0]")


def test_a_chain_through_the_executors_output_cache_is_comfyuis_cache():
    pattern, fix = patterns.classify({"path": WORKER_CACHE, "package": "core", "root_kind": "thread_frame"})

    assert pattern == "comfyui_cache"
    assert "not a pack's leak" in fix and "free_memory" in fix


def test_the_same_root_without_the_cache_is_still_a_threads_local():
    path = "thread 'Thread-1 (prompt_worker)' frame __main__.prompt_worker local 'model'"

    assert patterns.classify({"path": path, "package": "core", "root_kind": "thread_frame"})[0] == "thread_frame"


def test_a_packs_own_attribute_named_caches_is_not_comfyuis_cache():
    path = "some_pack.Loader.caches.outputs['x']"

    pattern, _ = patterns.classify({"path": path, "package": "some_pack", "root_kind": "class_attribute"})
    assert pattern == "class_cache"
