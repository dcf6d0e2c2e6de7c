"""The CPU performance table of issue 7: poot and llama.cpp side by side, same GGUF, 2 threads.

Rows: SmolLM2-135M Q4_1 (the default model) and synthetic GGUFs (``cpu_synthetic.py``) at Llama
3.2 1B shape in Q4_0, Q8_0, Q4_K, F16, BF16, at Qwen2 0.5B shape in its Q4_K_M type mix and at
Qwen2.5 1.5B shape in its Q4_K_M mix (Q4_K, Q6_K ``ffn_down`` and output), all
under ggml numerics (llama.cpp's arithmetic); then the F16 and BF16 files again under
``numerics="auto"`` (what a float checkpoint gets by default: exact, an f32 KV cache), against
llama.cpp's own arithmetic. Two rows are Hugging Face quantized directories at Llama 3.2 1B shape
(``quant_synthetic.py``: GPTQ int4 group 128, FP8 with 128 x 128 block scales), which llama.cpp
cannot read: their peer is poot itself on the Q4_0 and Q8_0 GGUF rows' files, and their target is
decode at 0.9x of it. Per row: prefill of 512 tokens (tok/s of the prompt) and decode of
128 tokens after a 64-token prompt (the 64+1 run subtracted from the 64+128 run), poot and
llama.cpp alternating within each round (so both see the same machine load), every run with a
fresh prompt (no prefix-cache hits), the median of the rounds; the ratio poot/peer, round by
round, and its median and range; and the decode roofline: bytes read per token (every weight
the step reads, plus the KV cache at mid-decode) over the read bandwidth measured before each
of the row's rounds (numpy, the same thread count, reading a buffer of those bytes over and
over: a model that fits the last-level cache is bounded by its bandwidth, not DRAM's), and
poot's fraction of it. Resident memory
is poot's RSS growth while it loads the model and generates, in a fresh interpreter, against
the GGUF size plus its KV pool.

Run: ``python benches/bench_cpu_table.py [--rows smollm2,llama-q4_0,...] [--write-docs]`` (the
full table takes tens of minutes on 2 cores), or under pytest, where only the SmolLM2 row runs
unless ``POOT_BENCH_FULL=1``. ``--json PATH`` saves the run (every round's figures, the
machine, the commit); ``--write-docs`` rewrites docs/performance.md's generated section with the
table and the targets judged from it; ``--from-json PATH --write-docs`` regenerates it from a
saved run. ``make bench`` does both. No thresholds: the targets are printed, not asserted.
``--check-layers N --rounds 1`` writes every synthetic shape with N layers instead: a quick
check that the rows load and run in both engines, never a measurement.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads must not spin here

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_synthetic as syn  # noqa: E402
import quant_synthetic as qsyn  # noqa: E402
from bandwidth import read_bandwidth  # noqa: E402

THREADS = 2
ROOT = Path(__file__).resolve().parents[1]

# (row key, label, shape or None for the default model, storage type, numerics)
# The rows run under ggml numerics, llama.cpp's arithmetic (the peer's): activations
# rounded or quantized as llama.cpp does and an f16 KV cache. Quantized GGUFs get it by
# default. The "auto" rows show what a float checkpoint gets by default instead: "exact"
# (activations as computed, an f32 KV cache), against llama.cpp's own arithmetic.
ROWS: list[tuple[str, str, syn.Shape | None, str, str]] = [
    ("smollm2", "SmolLM2-135M Q4_1", None, "Q4_1", "ggml"),
    ("llama-q4_0", "Llama-3.2-1B shape Q4_0", syn.LLAMA_1B, "Q4_0", "ggml"),
    ("llama-q8_0", "Llama-3.2-1B shape Q8_0", syn.LLAMA_1B, "Q8_0", "ggml"),
    ("llama-q4_k", "Llama-3.2-1B shape Q4_K", syn.LLAMA_1B, "Q4_K", "ggml"),
    ("llama-f16", "Llama-3.2-1B shape F16", syn.LLAMA_1B, "F16", "ggml"),
    ("llama-bf16", "Llama-3.2-1B shape BF16", syn.LLAMA_1B, "BF16", "ggml"),
    ("qwen2-mix", "Qwen2-0.5B shape Q5_0/Q8_0/Q4_K/Q6_K", syn.QWEN2_05B, "mix", "ggml"),
    (
        "qwen25-q4_k_m",
        "Qwen2.5-1.5B shape Q4_K_M (Q4_K, Q6_K down/output)",
        syn.QWEN25_15B,
        "q4_k_m",
        "ggml",
    ),
    # Hugging Face quantized directories (``quant_synthetic.py``); the peer is poot itself on
    # the GGUF row of the nearest bit width, same shape (``QUANT_PEERS``), and the target is
    # decode at QUANT_DECODE_RATIO of it.
    ("llama-gptq", "Llama-3.2-1B shape GPTQ int4 g128", syn.LLAMA_1B, "gptq-int4-g128", "ggml"),
    ("llama-fp8", "Llama-3.2-1B shape FP8 block 128", syn.LLAMA_1B, "fp8-block128", "ggml"),
    ("llama-f16-auto", "Llama-3.2-1B shape F16", syn.LLAMA_1B, "F16", "auto"),
    ("llama-bf16-auto", "Llama-3.2-1B shape BF16", syn.LLAMA_1B, "BF16", "auto"),
    # Issue 28's families (cpu_synthetic_families). MoE rows keep the real layer's shape and
    # expert count with fewer layers, said in the label.
    ("qwen3-q4_k_m", "Qwen3-0.6B shape Q4_K_M", syn.QWEN3_06B, "q4_k_m", "ggml"),
    ("gemma2-q4_k_m", "Gemma-2-2B shape Q4_K_M", syn.GEMMA2_2B, "q4_k_m", "ggml"),
    ("gemma3-q4_0", "Gemma-3-1B shape Q4_0", syn.GEMMA3_1B, "Q4_0", "ggml"),
    ("phi35-q4_k_m", "Phi-3.5-mini shape Q4_K_M", syn.PHI35_MINI, "q4_k_m", "ggml"),
    (
        "qwen3moe-q4_k_m",
        "Qwen3-30B-A3B shape, 8 of 48 layers, Q4_K_M",
        syn.QWEN3_30B_A3B,
        "q4_k_m",
        "ggml",
    ),
    (
        "qwen2moe-q4_0",
        "Qwen1.5-MoE-A2.7B shape, 6 of 24 layers, Q4_0",
        syn.QWEN15_MOE,
        "Q4_0",
        "ggml",
    ),
    (
        "olmoe-q4_k_m",
        "OLMoE-1B-7B shape, 8 of 16 layers, Q4_K_M",
        syn.OLMOE_1B_7B,
        "q4_k_m",
        "ggml",
    ),
    (
        "mixtral-q4_k_m",
        "Mixtral-8x7B shape, 2 of 32 layers, Q4_K_M",
        syn.MIXTRAL_8X7B,
        "q4_k_m",
        "ggml",
    ),
]


# The GGUF type each quantized directory row is measured against (poot on both).
QUANT_PEERS = {"gptq-int4-g128": "Q4_0", "fp8-block128": "Q8_0"}
QUANT_DECODE_RATIO = 0.9

_SALT = iter(range(1, 1 << 30))


def _prompt(n: int, vocab: int = 41000) -> list[int]:
    """Deterministic ordinary-text ids (not special tokens) below ``vocab``, BOS first,
    different on every call: poot's prefix cache (and any peer cache) must not turn a
    measurement into a hit."""
    salt = next(_SALT)
    span = min(40000, vocab - 1000)
    return [1] + [(i * 7919 + salt * 104729) % span + 1000 for i in range(n - 1)]


def bytes_per_token(path: Path, ctx: int, kv_elem: int = 2) -> tuple[int, int]:
    """(weight bytes one decode step reads, KV bytes at context `ctx`) of the GGUF at `path`:
    every tensor but the token embedding (one row of it is read), unless it is also the LM head
    (no ``output.weight``), and of an expert stack (``*_exps``) the `k` of `E` experts one
    token chooses; KV elements of `kv_elem` bytes (f16 under ggml numerics, f32 under exact)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    arch = str(r.fields["general.architecture"].contents())

    def meta(key: str, default: int = 0) -> int:
        f = r.fields.get(f"{arch}.{key}")
        return int(f.contents()) if f is not None else default

    experts, used = meta("expert_count"), meta("expert_used_count")
    total = 0
    for t in r.tensors:
        if not tied and t.name == "token_embd.weight":
            continue
        share = used / experts if experts and "_exps." in t.name else 1.0
        total += int(int(t.n_bytes) * share)
    layers, dim = meta("block_count"), meta("embedding_length")
    heads, kv_heads = meta("attention.head_count"), meta("attention.head_count_kv")
    head_dim = meta("attention.key_length", dim // heads)
    kv = 2 * layers * ctx * kv_heads * head_dim * kv_elem
    return total, kv


_RSS_SCRIPT = r"""
import json, sys
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
import numpy, poot
base = rss()
llm = poot.LLM(sys.argv[1], threads=int(sys.argv[2]), max_model_len=1024, numerics=sys.argv[3])
p = poot.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
llm.generate([[1] + [1000 + i for i in range(63)]], p)
print(json.dumps({"grown": rss() - base, "kv": llm.runtime.memory().get("kv_bytes", 0)}))
"""


def _size(path: Path) -> int:
    """A GGUF's size, or a directory's (every file in it)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _rss_ratio(path: Path, numerics: str) -> float:
    """poot's resident-memory growth over (GGUF size + KV pool), loading the model and
    generating in a fresh interpreter: in this process other rows' engines (and llama.cpp's)
    come and go, and their memory returning to the system hid part of a row's growth."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(path), str(THREADS), numerics],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    m = json.loads(out.stdout.strip().splitlines()[-1])
    return float(m["grown"]) / (_size(path) + m["kv"])


def _vocab(path: Path) -> int:
    """The vocabulary size of a GGUF, or of a directory (its config.json)."""
    if path.is_dir():
        return int(json.loads((path / "config.json").read_text())["vocab_size"])
    import gguf

    r = gguf.GGUFReader(str(path))
    return len(r.fields["tokenizer.ggml.tokens"].data)


@dataclass
class Row:
    label: str
    size: int
    prefill: dict[str, float] = field(default_factory=dict)  # impl -> tok/s
    decode: dict[str, float] = field(default_factory=dict)
    roofline: float = 0.0  # decode tok/s at the read bandwidth measured during the row
    bandwidth: float = 0.0  # median of the reads measured before each round, bytes/s
    # Per round: poot / peer (prefill, decode) and poot's decode over that round's roofline.
    prefill_ratios: list[float] = field(default_factory=list)
    decode_ratios: list[float] = field(default_factory=list)
    roofline_fractions: list[float] = field(default_factory=list)
    rss_ratio: float = 0.0  # poot RSS growth / (checkpoint size + KV pool)
    numerics: str = ""
    # Quantized directory rows: the peer is poot on a GGUF (named here), and decode must reach
    # this ratio of it; 0 for llama.cpp-peer rows (the issue-7 targets).
    peer: str = ""
    decode_target: float = 0.0


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_tokens(fn: Callable[[], int]) -> tuple[float, int]:
    """Seconds ``fn`` took and the tokens it says it generated."""
    t0 = time.perf_counter()
    n = fn()
    return time.perf_counter() - t0, n


def run_row(
    label: str,
    path: Path,
    rounds: int,
    peer_ok: bool,
    numerics: str = "ggml",
    peer_gguf: Path | None = None,
    weight_bytes: Callable[[int, int], tuple[int, int]] | None = None,
) -> Row:
    """One row: poot on ``path`` against llama.cpp on it, or, with ``peer_gguf``, against poot on
    that GGUF (a quantized directory's row); ``weight_bytes(ctx, kv_elem)`` gives a directory's
    bytes per decode step (``bytes_per_token`` reads GGUFs)."""
    import poot

    row = Row(label, _size(path))
    vocab = _vocab(path)
    row.rss_ratio = _rss_ratio(path, numerics)
    llm = poot.LLM(str(path), threads=THREADS, max_model_len=1024, numerics=numerics)
    row.numerics = llm.numerics

    def ours(prompt: list[int], n: int) -> Callable[[], int]:
        params = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return lambda: len(llm.generate([prompt], params)[0].outputs[0].token_ids)

    ours(_prompt(8, vocab), 4)()  # warm up: plans compiled, pages touched
    peer = None
    if peer_gguf is not None:
        peer_llm = poot.LLM(str(peer_gguf), threads=THREADS, max_model_len=1024, numerics=numerics)
        row.peer = f"poot on {peer_gguf.name}"
        row.decode_target = QUANT_DECODE_RATIO

        def theirs(prompt: list[int], n: int) -> Callable[[], int]:
            params = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            return lambda: len(peer_llm.generate([prompt], params)[0].outputs[0].token_ids)

        peer = peer_llm
    elif peer_ok:
        import llama_cpp

        peer = llama_cpp.Llama(str(path), n_threads=THREADS, n_ctx=1024, n_batch=512, verbose=False)

        def theirs(prompt: list[int], n: int) -> Callable[[], int]:
            # llama-cpp-python stops at the end-of-text token: about one synthetic prompt in
            # 15 ended after 19-27 tokens here, which read as a peer decoding 5x faster unless
            # its rate counts the tokens it made.
            def go() -> int:
                assert peer is not None
                peer.reset()
                out = peer.create_completion(prompt, max_tokens=n, temperature=0.0)
                return int(out["usage"]["completion_tokens"])

            return go

    if peer is not None:
        theirs(_prompt(8, vocab), 4)()
    impls: list[tuple[str, Callable[[list[int], int], Callable[[], int]]]] = [("poot", ours)]
    if peer is not None:
        impls.append(("peer", theirs))
    pre: dict[str, list[float]] = {k: [] for k, _ in impls}
    dec: dict[str, list[float]] = {k: [] for k, _ in impls}
    # The bandwidth is read before every round, next to the decodes it bounds: on a shared VM
    # it moved by 2x within minutes, so one reading at the start of the run made the later
    # rows' rooflines meaningless.
    kv_elem = 4 if row.numerics == "exact" else 2
    weights, kvb = (weight_bytes or (lambda c, e: bytes_per_token(path, c, e)))(64 + 64, kv_elem)
    reads: list[float] = []
    for _ in range(rounds):
        reads.append(read_bandwidth(THREADS, nbytes=weights + kvb, passes=3))
        for name, make in impls:
            pre[name].append(512 / _timed(make(_prompt(512, vocab), 1)))
            short = _timed(make(_prompt(64, vocab), 1))
            # Decode steps: every token after the first (which the prompt's step makes).
            long, made = _timed_tokens(make(_prompt(64, vocab), 129))
            dec[name].append(max(made - 1, 0) / max(long - short, 1e-9))
    row.prefill = {k: statistics.median(v) for k, v in pre.items()}
    row.decode = {k: statistics.median(v) for k, v in dec.items()}
    row.bandwidth = statistics.median(reads)
    row.roofline = row.bandwidth / (weights + kvb)
    # Ratios are taken round by round, between runs seconds apart, and then their median: the
    # machine's slow and fast minutes then cancel instead of landing on one side.
    if "peer" in pre:
        row.prefill_ratios = [a / b for a, b in zip(pre["poot"], pre["peer"], strict=True)]
        row.decode_ratios = [a / b for a, b in zip(dec["poot"], dec["peer"], strict=True)]
    row.roofline_fractions = [
        d * (weights + kvb) / bw for d, bw in zip(dec["poot"], reads, strict=True)
    ]
    return row


def _spread(values: list[float], fmt: str, unit: str = "") -> str:
    """`median (min-max)` of per-round values, or the one value."""
    med = format(statistics.median(values), fmt) + unit
    if len(values) < 2:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def machine() -> str:
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        flags = next(
            ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")
        ).split()
        simd = [f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma", "f16c")]
    except (OSError, StopIteration):
        simd = []
    cores = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {cores} cores, {mem:.0f} GiB; {' '.join(sorted(simd))}"


def table(rows: list[Row]) -> str:
    lines = [
        f"Read bandwidth: {THREADS} threads, numpy, reading a buffer of the row's bytes per "
        "decode step over and over (from cache where they fit), measured before every round "
        "of a row; the "
        "roofline column uses the row's median. Ratios and roofline fractions are the median "
        "of the rounds' own (each round's poot and llama.cpp runs, and its bandwidth reading, "
        "are seconds apart), with their range in brackets.",
        "",
        "| model | numerics | prefill 512 tok/s poot / llama.cpp | ratio | decode tok/s poot / "
        "llama.cpp | ratio | read GB/s | roofline tok/s | poot / roofline | RSS / (GGUF + KV) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        label = f"{r.label} (vs {r.peer})" if r.peer else r.label
        pp, pq = r.prefill.get("poot", 0.0), r.prefill.get("peer")
        dp, dq = r.decode.get("poot", 0.0), r.decode.get("peer")
        lines.append(
            f"| {label} | {r.numerics} | {pp:.1f} / {pq:.1f} | "
            f"{_spread(r.prefill_ratios, '.2f', 'x')} | "
            if pq
            else f"| {label} | {r.numerics} | {pp:.1f} / - | - | "
        )
        lines[-1] += (
            f"{dp:.1f} / {dq:.1f} | {_spread(r.decode_ratios, '.2f', 'x')} | "
            if dq
            else f"{dp:.1f} / - | - | "
        ) + (
            f"{r.bandwidth / 1e9:.1f} | {r.roofline:.1f} | "
            f"{_spread(r.roofline_fractions, '.0%')} | {r.rss_ratio:.2f} |"
        )
    return "\n".join(lines)


# Issue 7's targets: decode at the lower of 1.25x llama.cpp and 85% of the roofline (either
# meets it), prefill at 1.5x llama.cpp; judged on the median of the rounds.
DECODE_RATIO, DECODE_ROOFLINE, PREFILL_RATIO = 1.25, 0.85, 1.5


def targets(rows: list[Row]) -> str:
    """The targets table, judged from the rows' own rounds (nothing typed in by hand)."""
    lines = [
        f"Targets: decode {DECODE_RATIO}x llama.cpp or {DECODE_ROOFLINE:.0%} of the roofline "
        f"(either meets it), prefill {PREFILL_RATIO}x llama.cpp; each judged on the median of "
        "the rounds, their range in brackets. Quantized directory rows: decode "
        f"{QUANT_DECODE_RATIO}x poot on the GGUF of the nearest bit width (the peer column), "
        "prefill not targeted.",
        "",
        "| model | numerics | decode ratio | decode / roofline | decode met | prefill ratio "
        "| prefill met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        dec, pre = r.decode_ratios, r.prefill_ratios
        roof = r.roofline_fractions
        dmet = (bool(dec) and statistics.median(dec) >= DECODE_RATIO) or (
            bool(roof) and statistics.median(roof) >= DECODE_ROOFLINE
        )
        if r.decode_target:
            # A quantized directory's row: decode against poot on its GGUF peer, nothing else.
            dmet = bool(dec) and statistics.median(dec) >= r.decode_target
        pmet = bool(pre) and statistics.median(pre) >= PREFILL_RATIO
        label = f"{r.label} (vs {r.peer})" if r.peer else r.label
        lines.append(
            f"| {label} | {r.numerics} | "
            f"{_spread(dec, '.2f', 'x') if dec else '- (no peer)'} | "
            f"{_spread(roof, '.0%') if roof else '-'} | {'yes' if dmet else '**no**'} | "
            f"{_spread(pre, '.2f', 'x') if pre else '- (no peer)'} | "
            f"{('yes' if pmet else '**no**') if pre and not r.decode_target else '-'} |"
        )
    return "\n".join(lines)


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def save_json(rows: list[Row], path: Path) -> None:
    """One run: the rows with every round's figures, and what it ran on."""
    import dataclasses

    try:
        # The peer is usually a build on PYTHONPATH (shared/peers/llama-cpp.sh), not an
        # installed distribution, so ask the module itself.
        import llama_cpp

        peer = f"llama-cpp-python {llama_cpp.__version__}"
    except ImportError:
        peer = "none"
    meta = {
        "machine": machine(),
        "commit": _commit(),
        "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": THREADS,
        "peer": peer,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]}
    path.write_text(json.dumps(body, indent=1) + "\n")


def load_json(path: Path) -> tuple[dict[str, Any], list[Row]]:
    data = json.loads(path.read_text())
    return data["meta"], [Row(**r) for r in data["rows"]]


def write_docs(rows: list[Row], meta: dict[str, Any]) -> None:
    """Rewrites docs/performance.md's generated section (between the bench-table markers)
    from one run: the table and the targets, with the machine and commit that run was at."""
    doc = ROOT / "docs" / "performance.md"
    old = doc.read_text() if doc.is_file() else ""
    marker = "<!-- bench-table -->"
    body = (
        f"{marker}\n## Bench table\n\nGenerated by `make bench` (`benches/bench_cpu_table.py "
        f"--json ... --write-docs`) from one run. Machine: {meta['machine']}. Commit "
        f"{meta['commit']}, {meta['time']}, {meta['threads']} threads for both, llama.cpp = "
        f"{meta['peer']} (its own build), same GGUF files.\n\n"
        f"{table(rows)}\n\n{targets(rows)}\n{marker}\n"
    )
    if marker in old:
        head, _, rest = old.partition(marker)
        _, _, tail = rest.partition(marker + "\n")
        doc.write_text(head + body + tail)
    else:
        doc.write_text((old or "# CPU performance\n\n") + body)


def _peer_ok() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def run(keys: list[str], rounds: int | None = None, check_layers: int = 0) -> list[Row]:
    """The rows named by ``keys``; ``check_layers`` > 0 writes every synthetic shape with that
    many layers instead (a quick check that the rows load and run in both, not a
    measurement)."""
    from poot.checkpoints import cached_model

    smollm = cached_model()
    rows = []
    peer_ok = _peer_ok()
    for key, label, shape, quant, numerics in ROWS:
        if key not in keys:
            continue
        if smollm is None and (shape is None or shape.family is None):
            # The default model is the row, or lends its tokenizer to the synthetic file.
            raise SystemExit(f"row {key} needs the default model: run `poot pull` first")
        if shape is not None and check_layers:
            shape = syn.with_layers(shape, check_layers)
            label = f"{label} [check: {check_layers} layers]"
        if shape is not None and quant in QUANT_PEERS:
            path = qsyn.synthetic_hf(shape, quant, smollm)
            peer_gguf = syn.synthetic_gguf(shape, QUANT_PEERS[quant], smollm)
            n = rounds or 3

            def wb(ctx: int, kv_elem: int, shape: syn.Shape = shape, quant: str = quant):
                return qsyn.bytes_per_token(shape, quant, ctx, kv_elem)

            rows.append(run_row(label, path, n, peer_ok, numerics, peer_gguf, wb))
        else:
            path = smollm if shape is None else syn.synthetic_gguf(shape, quant, smollm)
            n = rounds or (3 if path.stat().st_size < 300e6 else 1)
            rows.append(run_row(label, path, n, peer_ok, numerics))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def test_cpu_table() -> None:
    keys = [k for k, *_ in ROWS] if os.environ.get("POOT_BENCH_FULL") else ["smollm2"]
    rows = run(keys)
    print()
    print(table(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(k for k, *_ in ROWS))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="save the run here")
    ap.add_argument(
        "--from-json", type=Path, default=None, help="print (and --write-docs) a saved run"
    )
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument(
        "--check-layers",
        type=int,
        default=0,
        help="synthetic shapes with this many layers: checks the rows run, measures nothing",
    )
    args = ap.parse_args()
    if args.from_json is not None:
        meta, rows = load_json(args.from_json)
    else:
        rows = run(args.rows.split(","), args.rounds, args.check_layers)
        if args.json is not None:
            save_json(rows, args.json)
        meta = json.loads(args.json.read_text())["meta"] if args.json else None
    print(table(rows))
    print()
    print(targets(rows))
    if args.write_docs:
        if args.check_layers:
            raise SystemExit("--check-layers runs measure nothing: they never go in the docs")
        if meta is None:
            raise SystemExit("--write-docs needs --json (the docs name the run they came from)")
        write_docs(rows, meta)


if __name__ == "__main__":
    main()
