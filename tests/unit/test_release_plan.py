"""What a release may cut, decided from a holder's pattern and steps alone (``leaks.release.plan``), and the cut's
path as a person reads it."""

import pytest

from comfy_memx.leaks import patterns
from comfy_memx.leaks.release import plan

MODULE_LIST = (("module", "/srv/ComfyUI/custom_nodes/pack", 1), ("item", ("=", "MODELS"), 2, "list"),
               ("index", 3, 4, "torch.nn.Linear"))
CLASS_DICT = (("class", "/srv/ComfyUI/custom_nodes/pack.model", "Qwen.Cache", 1), ("attr", "_cache", 2, "dict"),
              ("item", ("=", (1024, 1024)), 3, "tuple"), ("index", 1, 4, "torch.nn.Linear"))


PACKS = {"pack"}   # the custom-node packages loaded (a release cuts only from one of these)


def holder(pattern, package="pack", path="pack.MODELS[3]"):
    return {"path": path, "pattern": pattern, "package": package, "holder_package": package}


@pytest.mark.parametrize("pattern", plan.RELEASABLE)
def test_a_packs_cache_entry_is_planned_at_the_entry_of_its_container(pattern):
    decision = plan.decide(holder(pattern), MODULE_LIST, PACKS)
    assert isinstance(decision, plan.Plan) and decision.cut_at == 2 and decision.steps is MODULE_LIST


@pytest.mark.parametrize("pattern", sorted(set(patterns.SUGGESTIONS) - set(plan.RELEASABLE)))
def test_every_other_pattern_is_refused_with_a_reason_and_the_packs_fix(pattern):
    decision = plan.decide(holder(pattern), MODULE_LIST, PACKS)
    assert isinstance(decision, plan.Refusal)
    assert decision.why == plan.WHY_NOT[pattern] and decision.fix == patterns.SUGGESTIONS[pattern]


def test_comfyuis_own_cache_points_at_free():
    assert "/memx/free" in plan.decide(holder("comfyui_cache", package="core"), MODULE_LIST, PACKS).why


@pytest.mark.parametrize("package", ["core", "?", None])
def test_a_container_of_comfyui_or_of_no_known_package_is_refused(package):
    decision = plan.decide(holder("module_registry", package=package), MODULE_LIST, PACKS)
    assert isinstance(decision, plan.Refusal) and "ComfyUI itself" in decision.why


@pytest.mark.parametrize("package", ["sys", "torch", "pack_not_loaded"])
def test_a_container_of_a_module_that_is_no_loaded_custom_node_package_is_refused(package):
    steps = (("module", "sys", 1), ("item", ("=", "modules"), 2, "dict"), ("item", ("=", "x"), 3, "module"))
    decision = plan.decide(holder("module_registry", package=package, path="sys.modules['x']"), steps, PACKS)
    assert isinstance(decision, plan.Refusal) and f"belongs to {package}, which is not a custom-node" in decision.why
    assert isinstance(plan.decide(holder("module_registry", package=package), steps, {package}), plan.Plan)


def test_the_plan_starts_at_the_first_entry_of_a_container_at_any_depth():
    weak = (MODULE_LIST[0], ("item", ("=", "MEMO"), 2, "weakref.WeakKeyDictionary"), ("attr", "data", 3, "dict"),
            ("item", ("id", 7), 4, "dict"), ("item", ("=", ("k", "3")), 5, "comfy.model_patcher.ModelPatcher"),
            ("attr", "model", 6, "comfy.model_base.BaseModel"))
    decision = plan.decide(holder("module_registry"), weak, PACKS)
    assert isinstance(decision, plan.Plan) and decision.cut_at == 3
    assert plan.cut_text(weak, 3) == "pack.MEMO.data[<a key that is not a constant>]"


@pytest.mark.parametrize("steps", [(), MODULE_LIST[:2], MODULE_LIST[:2] + (("attr", "model", 4, "x"),)])
def test_a_chain_without_an_entry_step_at_the_container_is_refused(steps):
    decision = plan.decide(holder("appended_list"), steps, PACKS)
    assert isinstance(decision, plan.Refusal) and "by identity" in decision.why


def test_choose_prefers_a_releasable_holder_and_honours_a_path():
    hook = holder("callback_registry", path="pack.HOOKS[0]")
    cache = holder("class_cache", path="pack.model.Qwen.Cache._cache[(1024, 1024)][1]")
    steps = {hook["path"]: MODULE_LIST, cache["path"]: CLASS_DICT}
    assert plan.choose([hook, cache], steps, packages=PACKS).referrer is cache
    assert isinstance(plan.choose([hook, cache], steps, path=hook["path"], packages=PACKS), plan.Refusal)
    assert plan.choose([hook, cache], steps, path="pack.ELSEWHERE", packages=PACKS) is None
    assert plan.choose([], steps, packages=PACKS) is None


def test_releasable_now_says_what_a_row_shows():
    cache = holder("class_cache", path="pack.C._cache['k']")
    assert plan.releasable_now([cache], {cache["path"]: CLASS_DICT}, PACKS) == {"possible": True, "why": None,
                                                                         "path": cache["path"]}
    refused = plan.releasable_now([holder("closure")], {})
    assert refused["possible"] is False and refused["why"] == plan.WHY_NOT["closure"]
    assert plan.releasable_now([], {})["why"].startswith("no holder found yet")


def test_cut_text_reads_like_the_holder_path():
    assert plan.cut_text(CLASS_DICT) == "pack.model.Qwen.Cache._cache[(1024, 1024)]"
    assert plan.cut_text(MODULE_LIST) == "pack.MODELS[3]"
    lru = (MODULE_LIST[0], ("item", ("=", "load"), 2, "functools._lru_cache_wrapper"),
           ("lru_item", ("id", 99), 3, "x"))
    assert plan.cut_text(lru) == "pack.load -> lru_cache[<a key that is not a constant>]"
