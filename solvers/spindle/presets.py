"""Multi-task multi-modal workloads from the seed papers, with real module shapes.

Select with ``"workload": {"preset": "clip-imagebind"}`` (optionally ``"batch_scale": 2``). Shapes are the
published ones (layers, hidden, heads, FFN, tokens per sample); batch sizes are per training step per task.
Metaops of one module share its ``name`` and so its weights: stored once per device, gradients synced together.
"""

from __future__ import annotations

from typing import Any

# --- module shapes ---
VIT_L14 = {"name": "vit-l14", "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
           "ffn_hidden_size": 4096, "seq_length": 257}  # 224px / 14px patches + cls
CLIP_TEXT = {"name": "clip-text", "num_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
             "ffn_hidden_size": 3072, "seq_length": 77, "causal": True}
IB_AUDIO = {"name": "ib-audio", "num_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
            "ffn_hidden_size": 3072, "seq_length": 229}  # ViT-B on 128 mel x 204 frames, 16px patches stride 10
IB_DEPTH = {"name": "ib-depth", "num_layers": 12, "hidden_size": 384, "num_attention_heads": 6,
            "ffn_hidden_size": 1536, "seq_length": 197}  # ViT-S, 16px patches
IB_THERMAL = {**IB_DEPTH, "name": "ib-thermal"}
IB_IMU = {"name": "ib-imu", "num_layers": 6, "hidden_size": 512, "num_attention_heads": 8,
          "ffn_hidden_size": 2048, "seq_length": 251}  # 2000 steps x 6 channels in patches of 8
VIT_BIGG = {"name": "qwen-vl-vit", "num_layers": 48, "hidden_size": 1664, "num_attention_heads": 16,
            "ffn_hidden_size": 8192, "seq_length": 1025}  # OpenCLIP ViT-bigG at 448px
WHISPER_ENC = {"name": "whisper-large-enc", "num_layers": 32, "hidden_size": 1280, "num_attention_heads": 20,
               "ffn_hidden_size": 5120, "seq_length": 1500}
QWEN_7B = {"name": "qwen-7b", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "ffn_hidden_size": 11008, "mlp": "swiglu", "causal": True, "seq_length": 2048}
LLAMA_70B = {"name": "llama-70b", "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_kv_heads": 8,
             "ffn_hidden_size": 28672, "mlp": "swiglu", "causal": True, "seq_length": 2048}
DIT_LAYERS = 32
VIDEO_DIT = {"name": "video-dit", "num_layers": DIT_LAYERS, "hidden_size": 3072, "num_attention_heads": 24,
             "ffn_hidden_size": 12288, "seq_length": 8192}  # 121 frames 480p latents, 2x2 patches
AUDIO_DIT = {"name": "audio-dit", "num_layers": DIT_LAYERS, "hidden_size": 1536, "num_attention_heads": 12,
             "ffn_hidden_size": 6144, "seq_length": 1024}
JOINT_DIT = {"name": "joint-dit", "num_layers": 4, "hidden_size": 3072, "num_attention_heads": 24,
             "ffn_hidden_size": 12288, "seq_length": 9216}  # joint attention over video + audio tokens
OMNI_TEXT = {"name": "omni-text", "num_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
             "ffn_hidden_size": 3072, "seq_length": 512, "causal": True}
VIT_H = {"name": "omni-vit-h", "num_layers": 32, "hidden_size": 1280, "num_attention_heads": 16,
         "ffn_hidden_size": 5120, "seq_length": 257}
VIDEO_ENC = {"name": "omni-video", "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
             "ffn_hidden_size": 4096, "seq_length": 2048}  # 8 frames x 256 patches
POINT_ENC = {"name": "omni-3d", "num_layers": 12, "hidden_size": 384, "num_attention_heads": 6,
             "ffn_hidden_size": 1536, "seq_length": 513}  # Point-BERT style: 512 point groups + cls
OMNI_MOE = {"name": "omni-moe", "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
            "ffn_hidden_size": 2816, "mlp": "swiglu", "causal": True, "seq_length": 2048,
            "moe": {"num_experts": 8, "top_k": 2}}
POLICY = {"name": "policy", "num_layers": 28, "hidden_size": 1536, "num_attention_heads": 12, "num_kv_heads": 2,
          "ffn_hidden_size": 8960, "mlp": "swiglu", "causal": True, "seq_length": 1536}  # Qwen2-1.5B shape


def _op(name: str, task: str, module: dict[str, Any], batch: int, **kw: Any) -> dict[str, Any]:
    return {"name": name, "task": task, "batch_size": batch, "module": module, **kw}


def clip_imagebind() -> dict[str, Any]:
    """6 contrastive tasks x 2 encoders; the image encoder is shared by five tasks, text and audio by two."""
    enc = {"image": VIT_L14, "text": CLIP_TEXT, "audio": IB_AUDIO, "depth": IB_DEPTH, "thermal": IB_THERMAL,
           "imu": IB_IMU}
    tasks = [("image-text", "image", "text", 512), ("image-audio", "image", "audio", 256),
             ("image-depth", "image", "depth", 256), ("image-thermal", "image", "thermal", 128),
             ("image-imu", "image", "imu", 256), ("audio-text", "audio", "text", 256)]
    ops = [_op(f"{t}/{m}", t, enc[m], b) for t, a, c, b in tasks for m in (a, c)]
    return {"metaops": ops, "edges": []}


def qwen_vl() -> dict[str, Any]:
    """Vision and audio encoders feeding a shared 7B LLM (image captioning, ASR, video QA, pure text)."""
    rc = {"recompute": True}  # a step's activations of 7B-class stacks do not fit otherwise
    ops = [
        _op("caption/vit", "caption", VIT_BIGG, 64, **rc), _op("caption/llm", "caption", QWEN_7B, 64, **rc),
        _op("asr/whisper", "asr", WHISPER_ENC, 64, **rc), _op("asr/llm", "asr", QWEN_7B, 64, **rc),
        _op("video/vit", "video", VIT_BIGG, 128, **rc), _op("video/llm", "video", QWEN_7B, 32, **rc),
        _op("text/llm", "text", QWEN_7B, 64, **rc),
    ]
    edges = [["caption/vit", "caption/llm"], ["asr/whisper", "asr/llm"], ["video/vit", "video/llm"]]
    return {"metaops": ops, "edges": edges}


def llm70b_vision_audio() -> dict[str, Any]:
    """A 70B LLM branch fed by a vision encoder and an audio encoder (captioning, speech recognition, text).
    The LLM's 70B parameters cannot be data-parallel on any GPU (~390 GiB of states per device): its metaops run
    tensor-parallel / ZeRO-3 layouts inside their device blocks (``solvers.spindle.layouts``)."""
    rc = {"recompute": True}
    ops = [
        _op("caption/vit", "caption", VIT_BIGG, 64, **rc), _op("caption/llm", "caption", LLAMA_70B, 64, **rc),
        _op("asr/whisper", "asr", WHISPER_ENC, 64, **rc), _op("asr/llm", "asr", LLAMA_70B, 32, **rc),
        _op("text/llm", "text", LLAMA_70B, 64, **rc),
    ]
    edges = [["caption/vit", "caption/llm"], ["asr/whisper", "asr/llm"]]
    return {"metaops": ops, "edges": edges}


def seedance(couple_every: int = 8) -> dict[str, Any]:
    """Dual-branch video/audio diffusion transformer: the stacks meet in a joint block every k layers."""
    stacks = DIT_LAYERS
    ops: list[dict[str, Any]] = []
    edges: list[list[str]] = []
    batch = 32
    for i, off in enumerate(range(0, stacks, couple_every)):
        k = min(couple_every, stacks - off)
        v = _op(f"video/{i}", "video", VIDEO_DIT, batch, num_layers=k, layer_offset=off, recompute=True)
        a = _op(f"audio/{i}", "audio", AUDIO_DIT, batch, num_layers=k, layer_offset=off)
        j = _op(f"joint/{i}", "joint", JOINT_DIT, batch, num_layers=1, layer_offset=i, recompute=True)
        ops += [v, a, j]
        edges += [[v["name"], j["name"]], [a["name"], j["name"]]]
        if i:
            edges += [[f"joint/{i - 1}", v["name"]], [f"joint/{i - 1}", a["name"]]]
    return {"metaops": ops, "edges": edges}


def omni() -> dict[str, Any]:
    """Text/image/video/3D encoders into a shared MoE backbone, one metaop per task."""
    ops = [
        _op("text/enc", "text", OMNI_TEXT, 256), _op("text/moe", "text", OMNI_MOE, 64, recompute=True),
        _op("image/vit", "image", VIT_H, 512, recompute=True), _op("image/text", "image", OMNI_TEXT, 128),
        _op("image/moe", "image", OMNI_MOE, 64, recompute=True),
        _op("video/enc", "video", VIDEO_ENC, 128, recompute=True), _op("video/text", "video", OMNI_TEXT, 64),
        _op("video/moe", "video", OMNI_MOE, 32, recompute=True),
        _op("3d/enc", "3d", POINT_ENC, 256), _op("3d/text", "3d", OMNI_TEXT, 64),
        _op("3d/moe", "3d", OMNI_MOE, 32, recompute=True),
    ]
    edges = [["text/enc", "text/moe"], ["image/vit", "image/moe"], ["image/text", "image/moe"],
             ["video/enc", "video/moe"], ["video/text", "video/moe"], ["3d/enc", "3d/moe"], ["3d/text", "3d/moe"]]
    return {"metaops": ops, "edges": edges}


def unigrpo() -> dict[str, Any]:
    """One RL step of a unified text+image model: rollout (text decode, then image denoising), scoring by a
    reward model and a frozen reference, then the policy update."""
    group = 256  # prompts x samples per prompt
    ops = [
        _op("rollout/text", "rollout", {**POLICY, "seq_length": 256}, group, mode="decode", decode_tokens=256),
        _op("rollout/image", "rollout", {**POLICY, "seq_length": 1024}, group, mode="forward", steps=20),
        _op("reward/score", "reward", {**POLICY, "name": "reward-model"}, group, mode="forward"),
        _op("reference/logp", "reference", {**POLICY, "name": "reference"}, group, mode="forward"),
        _op("update/policy", "update", POLICY, group, recompute=True),
    ]
    edges = [["rollout/text", "rollout/image"], ["rollout/image", "reward/score"],
             ["rollout/image", "reference/logp"], ["reward/score", "update/policy"],
             ["reference/logp", "update/policy"]]
    return {"metaops": ops, "edges": edges}


def unigrpo_off_policy() -> dict[str, Any]:
    """``unigrpo`` one step off-policy: the update trains on the previous step's scored rollouts, so it need not
    wait for this step's: it may run beside the rollout on a separate device group, the updated policy then
    sent to the generation devices (``solvers.spindle.reshard``), or in turn on the same devices."""
    wl = unigrpo()
    wl["edges"] = [e for e in wl["edges"] if e[1] != "update/policy"]
    return wl


WORKLOAD_PRESETS = {"clip-imagebind": clip_imagebind, "qwen-vl": qwen_vl, "seedance": seedance, "omni": omni,
                    "unigrpo": unigrpo, "unigrpo-off-policy": unigrpo_off_policy,
                    "llm70b-vision-audio": llm70b_vision_audio}


def workload_preset(name: Any, batch_scale: Any = 1, **extra: Any) -> dict[str, Any]:
    """The preset's workload document; ValueError (reported on ``workload``) for an unknown name or override."""
    key = str(name).lower()
    if key not in WORKLOAD_PRESETS:
        raise ValueError(f"unknown workload preset {name!r}; known: {', '.join(sorted(WORKLOAD_PRESETS))}")
    if extra:
        raise ValueError(f"a preset takes only batch_scale as an override, not {', '.join(sorted(extra))}")
    if not isinstance(batch_scale, int) or batch_scale < 1:
        raise ValueError("batch_scale must be a positive integer")
    wl = WORKLOAD_PRESETS[key]()
    for op in wl["metaops"]:
        op["batch_size"] *= batch_scale
    return wl
