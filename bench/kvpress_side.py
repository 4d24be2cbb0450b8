"""The kvpress half of ``bench/bench_kv_peers.py``: kvpress's presses on headcount's prompts.

Runs in the kvpress virtual environment (``make kvpress``: torch, transformers < 5.3, kvpress
0.5.5), never in headcount's: it imports only torch, transformers, numpy and kvpress. It reads
``prompts.json`` that the headcount half wrote (token ids, split into the context kvpress
compresses and the question it appends, as kvpress's own pipeline does), loads the same
checkpoint directory with its own transformers (fp32, sdpa), and for every (press, kept fraction,
prompt) not done yet writes ``results/<press>@<kept>/<prompt>.json``:

- the prefill: the context in one forward inside ``with press(model)`` (the press compresses each
  layer's cache after its attention, as in ``KVPressTextGenerationPipeline``), then the question
  uncompressed at its true positions (``position_ids`` after the context, as the pipeline's
  ``generate_answer``);
- ``bytes``: the ``DynamicCache``'s key/value tensors after that prefill (context + question);
  ``full_bytes`` what an uncompressed cache holds at the prompt's length;
- ``tokens``: greedy decoding of up to ``max_new_tokens`` (stopping at the prompt file's stop
  ids), scored by the headcount half (one place decides "answered");
- ``loss``: the answer's mean cross-entropy, teacher-forced after the compressed prompt (the
  cache put back to its post-prefill tensors first);
- ``prefill_s``, ``decode_s``: wall-clock seconds.

How a kept fraction ``k`` maps onto each press (kvpress's ``compression_ratio`` is the fraction
removed): scorer presses and PyramidKV get ``compression_ratio = 1 - k`` of the context (the
question adds its few tokens on top: the measured bytes say what was kept); AdaKV(SnapKV) the
same, but it only masks (the cache keeps every token); DuoAttention streams as many KV heads as
headcount's retrieval budget at ``k`` (``head_compression_ratio`` = streaming / all KV heads),
the same heads (the pattern is headcount's retrieval ranking, set on the press directly instead
of ``load_attention_pattern``, which downloads), with sink 64 + recent 256 by default; it only
masks too.

    python bench/kvpress_side.py --prompts OUT/prompts.json --out OUT [--methods snapkv,knorm] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

#: the presses that only mask the cache (their cache keeps every token; attention skips the masked ones)
MASKING = ("adakv-snapkv", "duo-attention")


def press_factory(name: str, kept: float, prompts: dict):
    """The kvpress press ``name`` at kept fraction ``kept`` (None for ``none``: no press)."""
    import kvpress as kp

    ratio = round(1.0 - kept, 6)  # kvpress's compression_ratio: the fraction of the context removed
    simple = {"streaming-llm": kp.StreamingLLMPress, "snapkv": kp.SnapKVPress, "knorm": kp.KnormPress,
              "tova": kp.TOVAPress, "expected-attention": kp.ExpectedAttentionPress, "pyramidkv": kp.PyramidKVPress}
    if name == "none":
        return None
    if name in simple:
        return simple[name](compression_ratio=ratio)
    if name == "adakv-snapkv":
        return kp.AdaKVPress(press=kp.SnapKVPress(compression_ratio=ratio))
    if name == "duo-attention":
        duo = prompts["duo"]
        setting = duo["by_kept"][f"{kept:g}"]
        press = kp.DuoAttentionPress(head_compression_ratio=float(setting["head_compression_ratio"]))
        pattern = np.asarray(duo["pattern"], dtype=np.float64)  # [n_layers, n_kv]: higher = keeps the full cache
        n_stream = int(setting["n_streaming"])
        mask = torch.zeros(pattern.shape, dtype=torch.bool)
        if n_stream:  # the lowest-ranked KV heads stream (the ranking has no ties: ranks)
            low = np.argsort(pattern, axis=None, kind="stable")[:n_stream]
            mask[np.unravel_index(low, pattern.shape)] = True
        press.sink_size, press.recent_size, press.streaming_mask = int(duo["sink"]), int(duo["recent"]), mask
        press.post_init_from_model = lambda model: None  # keep the pattern set here (no download)
        return press
    raise SystemExit(f"error: unknown kvpress method {name!r}; methods: none, {', '.join([*simple, *MASKING])}")


def cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if isinstance(t, torch.Tensor))


def snapshot(cache):
    """The cache's tensors (DynamicLayer.update concatenates into new tensors: references suffice)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def put_back(cache, saved) -> None:
    for layer, (k, v) in zip(cache.layers, saved):
        layer.keys, layer.values = k, v


def forward_at(model, ids: list[int], cache, start: int):
    """``[len(ids), vocab]`` logits of ``ids`` fed after the cache at positions ``start...``, in one
    forward as kvpress's pipeline feeds a question. A masking press's attention patch needs a fake
    key no query of the step attends to; when several queries leave none ("Could not find fake
    keys", seen on head_dim 8) the cache is put back and the tokens go in one at a time (the same
    causal logits; each step then has one query per head, as in decoding)."""
    saved = snapshot(cache)
    x = torch.tensor([ids], dtype=torch.long)
    try:
        return model(input_ids=x, past_key_values=cache, position_ids=torch.arange(start, start + len(ids))[None],
                     use_cache=True).logits[0]
    except ValueError as e:
        if "fake keys" not in str(e):
            raise
    put_back(cache, saved)
    return torch.cat([model(input_ids=x[:, i:i + 1], past_key_values=cache, position_ids=torch.tensor([[start + i]]),
                            use_cache=True).logits[0] for i in range(len(ids))])


def run_one(model, press, p: dict, max_new_tokens: int, stops: set) -> dict:
    context = torch.tensor([p["context_ids"]], dtype=torch.long)
    target = list(p["target_ids"])
    n_ctx, n_q = context.shape[1], len(p["question_ids"])
    cache = transformers.DynamicCache()
    with torch.no_grad():
        start = time.perf_counter()
        if press is None:
            model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)
        else:
            with press(model):
                model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = forward_at(model, p["question_ids"], cache, n_ctx)  # the question at its true positions
        prefill_s = time.perf_counter() - start
        nbytes = cache_bytes(cache)
        saved = snapshot(cache)
        last = logits[-1]
        # greedy decoding, as kvpress's generate_answer (with the prompt file's stop ids)
        start, tokens, nxt, pos = time.perf_counter(), [], int(last.argmax()), n_ctx + n_q
        for i in range(max_new_tokens):
            tokens.append(nxt)
            if nxt in stops or i == max_new_tokens - 1:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, position_ids=torch.tensor([[pos + i]]),
                        use_cache=True)
            nxt = int(out.logits[0, -1].argmax())
        decode_s = time.perf_counter() - start
        # the answer's loss, teacher-forced after the compressed prompt
        put_back(cache, saved)
        steps = [last]
        if len(target) > 1:
            steps += list(forward_at(model, target[:-1], cache, pos))
        loss = float(torch.nn.functional.cross_entropy(torch.stack(steps).float(), torch.tensor(target)))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    full = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * element * (n_ctx + n_q)
    ratio = press.compression_ratio if press is not None else None  # kvpress's own: the fraction removed or masked
    return {"tokens": tokens, "loss": loss, "bytes": nbytes, "full_bytes": full, "prefill_s": prefill_s,
            "decode_s": decode_s, "n_new": len(tokens), "masks_only": press is not None and any(
                isinstance(press, c) for c in _masking_classes()),
            "press_compression": None if ratio is None else float(ratio)}


def _masking_classes():
    import kvpress as kp

    return (kp.AdaKVPress, kp.DuoAttentionPress)


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--methods", default="none,streaming-llm,snapkv,expected-attention,knorm,tova,pyramidkv,"
                                          "adakv-snapkv,duo-attention")
    ap.add_argument("--kept", default=None, help="kept fractions, comma-separated (default: the prompt file's)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    prompts = json.loads(a.prompts.read_text())
    kept = [float(k) for k in (a.kept.split(",") if a.kept else prompts["kept"])]
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    todo = []
    for m in methods:
        for k in ([1.0] if m == "none" else kept):
            folder = a.out / "results" / f"kvpress-{m}@{k:g}"
            for p in prompts["prompts"]:
                if not (folder / f"{p['id']}.json").is_file():
                    todo.append((m, k, folder, p))
    print(f"kvpress side: {len(todo)} runs to do (transformers {transformers.__version__})", file=sys.stderr)
    if not todo:
        return 0
    torch.set_num_threads(a.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(prompts["model_dir"], dtype=torch.float32,
                                                              attn_implementation="sdpa").eval()
    import kvpress  # noqa: F401  (patches the attention functions for the masking presses)

    stops, n = set(prompts["stop_ids"]), int(prompts["max_new_tokens"])
    for i, (m, k, folder, p) in enumerate(todo):
        press = press_factory(m, k, prompts)
        r = run_one(model, press, p, n, stops)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / f"{p['id']}.json", {"method": f"kvpress-{m}", "kept": k, "prompt": p["id"], **r})
        print(f"[{i + 1}/{len(todo)}] kvpress-{m}@{k:g} prompt {p['id']}: {r['prefill_s'] + r['decode_s']:.1f} s",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
