"""Build a real-architecture SD1.5 checkpoint (UNet + CLIP-L + VAE) with random weights, offline.

Run it with the interpreter of a ComfyUI environment (see ``.ci/comfyui-env``)::

    python bench/harness/make_checkpoint.py --tree /work/comfy-trees/v0.27.0 \\
        --out /work/comfy-ckpt/memx_sd15_random.safetensors [--seed 0] [--verify-load]
    python bench/harness/make_checkpoint.py --arch small [--no-clip] --tree ... --out memx_small.safetensors

The networks are built by the tree's own classes: the UNet through ``comfy.model_detection`` /
``comfy.supported_models`` (the tree picks the model config that matches an SD1.5 UNet configuration), the
text encoder through the model config's ``clip_target`` and the VAE as ``AutoencoderKL``, all in fp16. Their
weights are filled from a seeded generator (the same seed gives the same tensors whichever of the three trees
builds the file; only the order of the safetensors metadata may differ) and written through the model config's own
``process_*_state_dict_for_saving`` key mapping, i.e. in the layout of an original SD1.5 ``.safetensors``
checkpoint (``model.diffusion_model.*``, ``cond_stage_model.transformer.text_model.*``,
``first_stage_model.*``). Real ``CheckpointLoaderSimple`` loads it and the default text-to-image workflow
samples it (the pictures are noise, the memory traffic is that of a real SD1.5 model: about 2 GiB).

``--arch small`` builds a checkpoint of the same family in a few tens of MiB, for tests and soaks that keep many
models: the tree detects it as SD1.5 too (its ``SD15`` config matches on the model width, 320, the text context,
768, and the transformer kind, which a UNet of one level keeps) and ``CheckpointLoaderSimple`` builds it:

* UNet: one level (``channel_mult [1]``), one residual block with one cross-attention transformer, no middle block
  and no transformer in the two output blocks: 13.6 M weights (26 MiB in fp16; ComfyUI holds it in fp32 on CPU, 52
  MiB). ``comfy.model_detection`` reads the widths and depths from the tensors' shapes, so this is what it rebuilds
  (checked before the file is written);
* VAE: TAESD (``comfy.taesd.taesd.TAESD``, 2.4 M weights), which ComfyUI's ``VAE`` picks from the
  ``taesd_decoder.*`` keys in every tree (a full ``AutoencoderKL`` has a fixed 128-channel encoder: 84 M weights);
* text encoder: CLIP-L as in SD1.5 (123 M weights, 235 MiB in fp16, as ComfyUI holds it on CPU): its configuration
  is fixed in every tree, not read from the file, so it cannot be smaller. ``--no-clip`` leaves it out: the loader
  then returns no CLIP (it logs "no CLIP/text encoder weights in checkpoint") and a workflow takes its conditioning
  from another loader. The file is 265 MiB with the text encoder, 31 MiB without.

The default workflow (64x64, one step) samples it on CPU in well under a second; ``--verify-load`` (or
``--verify-only`` for a file already built) runs that in the tree: ComfyUI's checkpoint loader, CLIPTextEncode (zero
conditioning without a text encoder), KSampler and VAEDecode.

Nothing is downloaded: the CLIP tokenizer files ship inside the tree and are not part of a checkpoint.
``comfy`` is imported only after its command-line arguments were set to ``--cpu``. The same file works for
ComfyUI 0.3.64, 0.27.0 and 0.33.0; where their APIs differ the script feature-detects.

About 23 s and 2.8 GB of RAM on 2 cores (imports ~4-7 s, random fill ~7-10 s, writing 1.99 GiB ~5 s); ``--arch
small`` about 15 s and 1.3 GB (imports ~5-10 s, random fill ~8 s).
Exit status 0 on success; the last line printed is a JSON summary (path, bytes, tensors, parameters, seconds).
"""

import argparse
import inspect
import json
import logging
import math
import os
import sys
import time

# Architecture hyper-parameters of Stable Diffusion 1.x (the published v1-inference.yaml of the CompVis
# release), in the form ComfyUI's UNet takes them. ``attention_resolutions`` is turned into per-block
# transformer depths by the tree's comfy.model_detection.convert_config when it has one.
SD15_UNET_LDM_CONFIG = {
    "use_checkpoint": False,
    "image_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 320,
    "attention_resolutions": [4, 2, 1],
    "num_res_blocks": 2,
    "channel_mult": [1, 2, 4, 4],
    "num_heads": 8,
    "use_spatial_transformer": True,
    "transformer_depth": 1,
    "context_dim": 768,
    "legacy": False,
    "adm_in_channels": None,
    "use_linear_in_transformer": False,
    "use_temporal_resblock": False,
    "use_temporal_attention": False,
}

# The small UNet of ``--arch small``, in the per-block form the tree's UNetModel takes: SD1.5's width (320), text
# context (768, from CLIP-L) and transformer kind (a convolution as proj_in), one level with one residual block and
# one transformer, no middle block (-2), no transformer in the output blocks.
SMALL_UNET_CONFIG = {
    "use_checkpoint": False,
    "image_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 320,
    "num_res_blocks": [1],
    "channel_mult": [1],
    "transformer_depth": [1],
    "transformer_depth_output": [0, 0],
    "transformer_depth_middle": -2,
    "num_heads": 8,
    "use_spatial_transformer": True,
    "context_dim": 768,
    "legacy": False,
    "adm_in_channels": None,
    "use_linear_in_transformer": False,
    "use_temporal_resblock": False,
    "use_temporal_attention": False,
}

ARCHES = ("sd15", "small")

# First-stage autoencoder of SD 1.x (AutoencoderKL, f=8, 4 latent channels).
SD15_VAE_DDCONFIG = {
    "double_z": True,
    "z_channels": 4,
    "resolution": 256,
    "in_channels": 3,
    "out_ch": 3,
    "ch": 128,
    "ch_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_resolutions": [],
    "dropout": 0.0,
}
SD15_VAE_EMBED_DIM = 4

# Key prefixes that a loadable SD1.5 checkpoint must have after saving (the text encoder's only when it is written).
UNET_PREFIX, CLIP_PREFIX, VAE_PREFIX = "model.diffusion_model.", "cond_stage_model.", "first_stage_model."


def log(message):
    print(f"[make_checkpoint] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="ComfyUI source tree (the folder with main.py and comfy/)")
    parser.add_argument("--out", required=True, help="output .safetensors file (written atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--arch", choices=ARCHES, default="sd15",
                        help="sd15: SD1.5's UNet, CLIP-L and VAE (2 GiB, default); small: a one-level UNet of the "
                             "SD1.5 family, CLIP-L and TAESD (265 MiB; 31 MiB with --no-clip)")
    parser.add_argument("--no-clip", action="store_true",
                        help="leave the text encoder out (the loader then returns no CLIP)")
    parser.add_argument("--verify-load", action="store_true",
                        help="after saving, load the file with the tree's comfy.sd.load_checkpoint_guess_config and "
                             "sample it once (one KSampler step at 64x64, VAE decode)")
    parser.add_argument("--verify-only", action="store_true",
                        help="build nothing: load and sample the existing --out file as --verify-load does (with "
                             "the --arch and --no-clip it was built with)")
    return parser.parse_args(argv)


def import_comfy_for_cpu(tree):
    """Put ``tree`` first on sys.path and import comfy with its arguments parsed as ``--cpu``.

    comfy.cli_args parses sys.argv only when comfy.options.args_parsing is set; it is parsed here from a
    controlled argv so that comfy.model_management, imported later, picks the CPU device and never probes a GPU.
    """
    tree = os.path.abspath(tree)
    if not os.path.isfile(os.path.join(tree, "comfy", "cli_args.py")):
        raise SystemExit(f"--tree {tree}: no comfy/cli_args.py there, not a ComfyUI tree")
    if "comfy" in sys.modules:
        raise RuntimeError("comfy was imported before its arguments were set")
    sys.path.insert(0, tree)

    import comfy.options
    saved_argv = sys.argv
    sys.argv = [saved_argv[0], "--cpu"]
    try:
        comfy.options.enable_args_parsing()
        import comfy.cli_args
    finally:
        sys.argv = saved_argv
        comfy.options.enable_args_parsing(False)
    if not comfy.cli_args.args.cpu:
        raise RuntimeError("comfy.cli_args did not take --cpu")

    import comfy.model_management
    device = comfy.model_management.get_torch_device()
    if str(device) != "cpu":
        raise RuntimeError(f"comfy picked device {device}, expected cpu")
    return tree


def tree_version(tree):
    try:
        with open(os.path.join(tree, "comfyui_version.py"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("__version__"):
                    return line.split("=", 1)[1].strip().strip("\"'")
    except OSError:
        pass
    return "unknown"


def sd15_unet_config():
    """The SD1.5 UNet configuration in the per-block form the tree's UNetModel takes."""
    import comfy.model_detection
    config = dict(SD15_UNET_LDM_CONFIG)
    convert = getattr(comfy.model_detection, "convert_config", None)
    if convert is not None:
        return convert(config)
    # Fallback for a tree without convert_config: spell the per-block depths out.
    config.pop("attention_resolutions")
    config["num_res_blocks"] = [2, 2, 2, 2]
    config["transformer_depth"] = [1, 1, 1, 1, 1, 1, 0, 0]
    config["transformer_depth_output"] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    config["transformer_depth_middle"] = 1
    return config


def unet_config_of(arch):
    """The UNet configuration of ``arch`` in the tree's per-block form."""
    return sd15_unet_config() if arch == "sd15" else dict(SMALL_UNET_CONFIG)


def sd15_model_config(arch="sd15"):
    """Ask the tree which supported model matches the UNet configuration of ``arch`` (expects its SD15 class)."""
    import comfy.model_detection
    import comfy.supported_models
    unet_config = unet_config_of(arch)
    model_config = comfy.model_detection.model_config_from_unet_config(unet_config)
    expected = getattr(comfy.supported_models, "SD15", None)
    if model_config is None or (expected is not None and type(model_config) is not expected):
        raise RuntimeError(f"the tree did not map the {arch} UNet config to SD15 (got {type(model_config).__name__})")
    return model_config


def call_with_supported_kwargs(func, *args, **kwargs):
    """Call ``func`` with only those keyword arguments its signature accepts (APIs differ between trees)."""
    params = inspect.signature(func).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return func(*args, **kwargs)


def randomize_(module, generator, torch):
    """Fill every floating-point parameter and buffer of ``module`` from ``generator``, deterministically.

    ComfyUI builds its layers without initialising them (torch.empty), so every tensor is written here:
    matrices and convolution kernels ~ N(0, 1/fan_in) (variance-preserving, keeps fp16 activations finite),
    embeddings ~ N(0, 0.02^2), norm scales = 1, biases = 0, CLIP's logit_scale = log(100).
    """
    count = 0
    with torch.no_grad():
        tensors = list(module.named_parameters()) + list(module.named_buffers())
        for name, tensor in sorted(tensors, key=lambda item: item[0]):
            if not tensor.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if tensor.dim() == 0:
                tensor.fill_(math.log(100.0) if "logit_scale" in name else 0.0)
            elif "embedding" in name and tensor.dim() == 2:
                tensor.normal_(0.0, 0.02, generator=generator)
            elif tensor.dim() >= 2:
                fan_in = tensor[0].numel()
                tensor.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=generator)
            elif leaf == "bias":
                tensor.zero_()
            else:
                tensor.fill_(1.0)
            count += tensor.numel()
    return count


def build_vae(arch, torch):
    """The first-stage autoencoder of ``arch``, in fp16: SD1.5's AutoencoderKL, or TAESD for ``small``."""
    if arch == "sd15":
        from comfy.ldm.models.autoencoder import AutoencoderKL
        return AutoencoderKL(ddconfig=dict(SD15_VAE_DDCONFIG), embed_dim=SD15_VAE_EMBED_DIM).to(torch.float16)
    import comfy.taesd.taesd
    return comfy.taesd.taesd.TAESD(latent_channels=SD15_VAE_EMBED_DIM).to(torch.float16)


def settle_vae_scalars_(vae, torch):
    """TAESD's ``vae_scale`` (its latents are divided by it) must be 1 and ``vae_shift`` 0, as in published TAESD
    files; the random fill sets every scalar to 0."""
    with torch.no_grad():
        if hasattr(vae, "vae_scale"):
            vae.vae_scale.fill_(1.0)
        if hasattr(vae, "vae_shift"):
            vae.vae_shift.fill_(0.0)


def build_state_dict(seed, arch="sd15", clip=True):
    """The checkpoint's tensors (fp16), built by the tree's classes and filled from ``seed``: the model config,
    the state dict in an original checkpoint's layout, and the number of weights."""
    import torch
    import comfy.sd1_clip  # noqa: F401  (imported for the clip_target classes)

    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)

    # Built directly in fp16 (what SD1.5 checkpoints ship as): half the memory traffic of fp32 + a cast.
    dtype = torch.float16
    started = time.monotonic()
    model_config = sd15_model_config(arch)
    call_with_supported_kwargs(model_config.set_inference_dtype, dtype, None)
    base_model = model_config.get_model({}, "", device=torch.device("cpu"))
    unet = base_model.diffusion_model
    n_unet = randomize_(unet, generator, torch)
    log(f"UNet {type(unet).__name__} via {type(model_config).__name__}: {n_unet / 1e6:.1f} M weights "
        f"({time.monotonic() - started:.1f} s)")
    state_dict = dict(model_config.process_unet_state_dict_for_saving(dict(unet.state_dict())))
    del base_model, unet

    n_clip = 0
    if clip:
        started = time.monotonic()
        clip_target = model_config.clip_target({})
        clip_params = dict(getattr(clip_target, "params", {}) or {})
        clip_model = call_with_supported_kwargs(clip_target.clip, device="cpu", dtype=dtype,
                                                model_options={}, **clip_params)
        n_clip = randomize_(clip_model, generator, torch)
        log(f"text encoder {type(clip_model).__name__}: {n_clip / 1e6:.1f} M weights "
            f"({time.monotonic() - started:.1f} s)")
        state_dict.update(model_config.process_clip_state_dict_for_saving(dict(clip_model.state_dict())))
        del clip_model

    started = time.monotonic()
    vae = build_vae(arch, torch)
    n_vae = randomize_(vae, generator, torch)
    settle_vae_scalars_(vae, torch)
    log(f"VAE {type(vae).__name__}: {n_vae / 1e6:.1f} M weights ({time.monotonic() - started:.1f} s)")
    state_dict.update(model_config.process_vae_state_dict_for_saving(dict(vae.state_dict())))
    del vae

    out = {}
    for key, tensor in state_dict.items():
        if tensor.is_floating_point():
            tensor = tensor.to(torch.float16)
        out[key] = tensor.detach().contiguous()
    del state_dict
    return model_config, out, n_unet + n_clip + n_vae


def expected_prefixes(clip=True):
    """The key prefixes the saved checkpoint must have: the UNet's and the VAE's, and the text encoder's with
    ``clip``."""
    return (UNET_PREFIX, CLIP_PREFIX, VAE_PREFIX) if clip else (UNET_PREFIX, VAE_PREFIX)


def check_detected_as_sd15(state_dict, model_config=None, clip=True):
    """The tree's own detection must see an SD1.5 model in the saved keys (what CheckpointLoaderSimple does), with
    the very UNet configuration the weights were built with (so that the loader's UNet takes every tensor)."""
    import comfy.model_detection
    import comfy.supported_models
    missing = [p for p in expected_prefixes(clip) if not any(k.startswith(p) for k in state_dict)]
    if missing:
        raise RuntimeError(f"no keys with prefixes {missing}")
    if not clip and any(k.startswith(CLIP_PREFIX) for k in state_dict):
        raise RuntimeError(f"keys with prefix {CLIP_PREFIX} although the text encoder was left out")
    prefix = UNET_PREFIX
    if hasattr(comfy.model_detection, "unet_prefix_from_state_dict"):
        prefix = comfy.model_detection.unet_prefix_from_state_dict(state_dict)
    detected = comfy.model_detection.model_config_from_unet(state_dict, prefix)
    if detected is None or type(detected) is not comfy.supported_models.SD15:
        raise RuntimeError(f"tree detects the saved weights as {type(detected).__name__}, not SD15")
    if model_config is not None:
        differing = {k: (v, model_config.unet_config.get(k)) for k, v in detected.unet_config.items()
                     if k in model_config.unet_config and model_config.unet_config[k] != v}
        if differing:
            raise RuntimeError(f"the tree detects another UNet than the one built (detected, built): {differing}")


def save(state_dict, path, metadata):
    import comfy.utils
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        if hasattr(comfy.utils, "save_torch_file"):
            comfy.utils.save_torch_file(state_dict, tmp, metadata=metadata)
        else:
            import safetensors.torch
            safetensors.torch.save_file(state_dict, tmp, metadata=metadata)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # safetensors creates the file 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def verify_load(path, clip=True):
    """Load the file as CheckpointLoaderSimple does (a model, a VAE, and a CLIP exactly when one was written), then
    run what the default workflow runs with it on CPU: text conditioning (zeros without a CLIP), one KSampler step on
    a 64x64 latent, VAE decode. Returns the decoded image's shape."""
    import torch
    import comfy.sd
    import nodes  # ComfyUI's core nodes, at the tree's root (on sys.path)

    loaded = comfy.sd.load_checkpoint_guess_config(path, output_vae=True, output_clip=True)
    model, text_encoder, vae = loaded[0], loaded[1], loaded[2]
    if model is None or vae is None or (text_encoder is None) == clip:
        raise RuntimeError(f"load_checkpoint_guess_config returned model={model} clip={text_encoder} vae={vae}")
    if text_encoder is not None:
        positive = nodes.CLIPTextEncode().encode(text_encoder, "a photograph of a lighthouse")[0]
        negative = nodes.CLIPTextEncode().encode(text_encoder, "")[0]
    else:
        positive = negative = [[torch.zeros(1, 77, SMALL_UNET_CONFIG["context_dim"]), {}]]
    latent = nodes.EmptyLatentImage().generate(64, 64, 1)[0]
    samples = nodes.KSampler().sample(model, 0, 1, 8.0, "euler", "normal", positive, negative, latent)[0]
    image = nodes.VAEDecode().decode(vae, samples)[0]
    if tuple(image.shape) != (1, 64, 64, 3) or not bool(torch.isfinite(image).all()):
        raise RuntimeError(f"sampling gave an image of shape {tuple(image.shape)} (finite: "
                           f"{bool(torch.isfinite(image).all())})")
    log(f"verify-load: {type(model.model).__name__} / "
        f"{type(text_encoder.cond_stage_model).__name__ if text_encoder is not None else 'no CLIP'} / "
        f"{type(vae.first_stage_model).__name__}; one KSampler step at 64x64 and VAE decode: image "
        f"{tuple(image.shape)}")
    return tuple(image.shape)


def describe_model(arch, clip):
    """The file's ``memx_model`` metadata: what it holds."""
    unet = "SD1.5 UNet" if arch == "sd15" else "one-level SD1.5-family UNet"
    vae = "VAE" if arch == "sd15" else "TAESD"
    return f"{unet}{' + CLIP-L' if clip else ''} + {vae}, random weights, fp16"


def main(argv=None):
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    started = time.monotonic()
    tree = import_comfy_for_cpu(opts.tree)
    import torch
    version = tree_version(tree)
    log(f"ComfyUI {version} at {tree}, torch {torch.__version__}, seed {opts.seed} "
        f"(imports {time.monotonic() - started:.1f} s)")

    clip = not opts.no_clip
    if opts.verify_only:
        shape = verify_load(opts.out, clip)
        print(json.dumps({"path": os.path.abspath(opts.out), "verified": True, "image_shape": list(shape),
                          "arch": opts.arch, "clip": clip, "comfyui_version": version,
                          "seconds": round(time.monotonic() - started, 1)}), flush=True)
        return 0
    model_config, state_dict, n_params = build_state_dict(opts.seed, opts.arch, clip)
    check_detected_as_sd15(state_dict, model_config, clip)
    # No tree version in the metadata: the same seed gives the same bytes whichever tree built the file.
    metadata = {"memx_random_weights": "1", "memx_seed": str(opts.seed), "memx_arch": opts.arch,
                "memx_model": describe_model(opts.arch, clip)}
    saving = time.monotonic()
    save(state_dict, opts.out, metadata)
    n_tensors = len(state_dict)
    del state_dict
    size = os.path.getsize(opts.out)
    log(f"wrote {opts.out}: {size / 2**30:.2f} GiB, {n_tensors} tensors ({time.monotonic() - saving:.1f} s)")
    if opts.verify_load:
        verify_load(opts.out, clip)
    summary = {"path": os.path.abspath(opts.out), "bytes": size, "tensors": n_tensors, "parameters": n_params,
               "seed": opts.seed, "arch": opts.arch, "clip": clip, "comfyui_version": version,
               "torch": torch.__version__, "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
