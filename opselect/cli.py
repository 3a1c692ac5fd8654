"""The `opselect` command line: warm, show, explain, calibrate, clear, export, import, demo."""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  opselect warm spec.yaml                       tune every shape a spec lists
  opselect warm --op isin --shapes "16777216;1024" --dtype int32 --dtype int64
  opselect explain isin --shapes "1000000;5000" --dtype int64
  opselect explain topk --shapes 64x128000 --dtype bfloat16 --opt k=50 --what-if H200
  opselect show --op isin
  opselect export tuned.json   /   opselect import tuned.json

Shapes: dims joined by 'x', one shape per tensor argument joined by ';' ("" or "()" for 0-d).
The cache lives in $OPSELECT_CACHE_DIR (default ~/.cache/opselect); --cache-dir overrides it.
"""


def _parse_shapes(text: str) -> list[list[int]]:
    shapes = []
    for part in text.split(";"):
        part = part.strip()
        if part in ("", "()"):
            shapes.append([])
            continue
        try:
            dims = [int(d) for d in part.replace(",", "x").split("x")]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad shape {part!r}: expected dims joined by 'x', e.g. 64x128000") from None
        if any(d < 0 for d in dims):
            raise argparse.ArgumentTypeError(f"bad shape {part!r}: dims must be >= 0")
        shapes.append(dims)
    return shapes


def _parse_opt(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value read as YAML (k=50, invert=true, dims=[1,0]); a bare comma list
    (dims=1,0) is a list of its items, as the user meant."""
    import yaml

    if "=" not in text:
        raise argparse.ArgumentTypeError(f"bad option {text!r}: expected KEY=VALUE, e.g. k=50")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw)
        if isinstance(value, str) and "," in raw and not raw.strip().startswith(("'", '"')):
            value = [yaml.safe_load(v) for v in raw.split(",")]
    except Exception:  # noqa: BLE001 - yaml.YAMLError
        raise argparse.ArgumentTypeError(f"bad option {text!r}: its value is not valid YAML "
                                         "(e.g. k=50, dims=[1,0], invert=true)") from None
    return key.strip(), value


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported in one line (usage stays in --help) as a UsageError,
    so main() answers every mistake alike: one line, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        from .errors import UsageError

        raise UsageError(f"{message} (see {self.prog} --help)")


def _console():
    from rich.console import Console

    return Console()


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    if math.isinf(s):
        return "failed"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


# -- warm -------------------------------------------------------------------------------------------
def cmd_warm(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .warm import expand, load_spec, warm_item

    from .errors import UsageError

    entries: list[dict] = []
    for spec in args.spec:
        entries.extend(load_spec(spec))
    if args.op:
        if not args.shapes:
            raise UsageError("--op needs at least one --shapes")
        entries.append({"op": args.op, "cases": args.shapes, "dtypes": args.dtype or ["float32"],
                        "options": dict(args.opt or [])})
    if not entries:
        raise UsageError("give a spec file or --op with --shapes (see --help)")
    items = list(expand(entries))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        from .sharded_warm import run_torchrun

        return run_torchrun(items, args.device, _console())
    if args.shards is not None and args.shards != 1:
        from .sharded_warm import run_shards

        _device(args.device)  # a bad --device is said before any worker starts
        return run_shards(items, args.shards, args.device, _console())
    device = _device(args.device)
    interrupted = False
    console = _console()
    rows = []
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("warming", total=len(items))
        try:
            for item in items:
                progress.update(task, description=f"warming {item.label()}")
                decision = warm_item(item, device)
                rows.append((item, decision))
                progress.advance(task)
        except KeyboardInterrupt:
            interrupted = True
            console.print(f"[yellow]interrupted: {len(rows)} of {len(items)} entries were measured "
                          "and are in the cache[/yellow]")
    table = Table(title=f"tuned on {device}")
    for h in ("op / shapes / dtype", "choice", "time", "torch", "speedup"):
        table.add_column(h, justify="right" if h in ("time", "torch", "speedup") else "left")
    for item, d in rows:
        chosen = d.candidate(d.choice).measured_s
        torch_t = d.candidate("torch").measured_s
        speed = (f"{torch_t / chosen:.2f}x" if chosen and torch_t and math.isfinite(chosen)
                 else "-")
        table.add_row(item.label(), d.choice, _fmt_s(chosen), _fmt_s(torch_t), speed)
    console.print(table)
    return EXIT_INTERRUPTED if interrupted else 0


#: what a shell reports for a program stopped by Ctrl-C (128 + SIGINT)
EXIT_INTERRUPTED = 130


def _device(name: str | None):
    from .warm import parse_device

    return parse_device(name)


# -- show -------------------------------------------------------------------------------------------
#: above this many rows `show` streams tab-separated lines instead of drawing one table
SHOW_TABLE_ROWS = 1000


def cmd_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from .errors import UsageError
    from .tune_cache import store

    if args.limit < 0:
        raise UsageError(f"--limit: expected a whole number >= 0, got {args.limit}")
    st = store().patient()
    console = _console()
    console.print(f"tune cache: {st.state()}")
    total = st.count_records(args.op)
    heads = ("op", "device", "key", "best", "time", "torch", "speedup", "backends", "software")
    stream = not args.limit or args.limit > SHOW_TABLE_ROWS
    table = Table()
    for h in heads:
        table.add_column(h)
    if stream:
        print("\t".join(heads))
    n = 0
    for rec in st.records(args.op, args.limit or None):
        n += 1
        best = rec.best()
        torch_t = rec.timings.get("torch")
        fp = rec.fingerprint
        row = (rec.op, fp.device, rec.key, best[0] if best else "-",
               _fmt_s(best[1].seconds) if best else "-",
               _fmt_s(torch_t.seconds) if torch_t else "-",
               f"{torch_t.seconds / best[1].seconds:.2f}x"
               if best and torch_t and torch_t.seconds and best[1].seconds else "-",
               str(len(rec.timings)), f"torch {fp.torch}, triton {fp.triton}, opselect {fp.opselect}")
        if stream:  # a table of every row would be drawn only after all were read
            print("\t".join(row))
        else:
            table.add_row(*row)
    if not stream:
        console.print(table)
    for cal in st.calibrations():
        console.print(f"calibration for {cal.fingerprint.device}: "
                      + ", ".join(f"{k}={v:.3g}" for k, v in sorted(cal.constants.items())))
    of_op = f" of {args.op}" if args.op else ""
    if args.limit and n >= args.limit and total > n:
        summary = f"{n} of {total} tune record(s){of_op} shown (--limit 0 shows all)"
    elif total > n:  # the rest did not validate (each kind of fault was warned about once)
        summary = f"{n} tune record(s){of_op}; {total - n} invalid row(s) skipped"
    else:
        summary = f"{n} tune record(s){of_op}"
    console.print(summary, soft_wrap=True)
    return 0


# -- explain ----------------------------------------------------------------------------------------
def cmd_explain(args: argparse.Namespace) -> int:
    from .dispatch import get_op
    from .errors import UsageError
    from .warm import make_inputs, parse_dtype

    op = get_op(args.op)
    shapes = args.shapes[0] if args.shapes else None
    if shapes is None:
        raise UsageError("give --shapes (see --help)")
    dtype = parse_dtype((args.dtype or ["float32"])[0])
    options = dict(args.opt or [])
    if args.what_if:
        from .heuristics.device_model import what_if
        from .heuristics.device_model import KNOWN_GPUS

        if args.what_if.upper() not in KNOWN_GPUS:
            raise UsageError(f"--what-if {args.what_if}: unknown GPU; known: {', '.join(KNOWN_GPUS)}")
        print(what_if(op, shapes, dtype, options, args.what_if))
        return 0
    device = _device(args.device)
    a, kw = make_inputs(op.name, shapes, dtype, options, device)
    op.explain(*a, backend=args.backend, **kw).print()
    return 0


# -- calibrate / clear / export / import ------------------------------------------------------------
def cmd_calibrate(args: argparse.Namespace) -> int:
    from .heuristics.calibrate import calibrate

    device = _device(args.device)
    if device.type != "cuda":
        from .errors import UsageError

        raise UsageError(f"--device {device}: calibration measures a GPU; give a CUDA device")
    calibrate(device, fit=not args.no_fit)
    print("calibration stored in the tune cache")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from .tune_cache import store

    st = store().patient()
    what = f"the {args.op} entries of" if args.op else "every entry of"
    if not args.yes:
        try:
            answer = input(f"delete {what} {st.path}? [y/N] ")
        except EOFError:  # stdin closed: no answer is not a yes
            answer = ""
            print()
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    print(f"deleted {st.clear(args.op)} entries")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .tune_cache import store

    n = store().patient().export(Path(args.file))
    # (to stderr when the export itself went to stdout)
    print(f"exported {n} entries to {'standard output' if args.file == '-' else args.file}",
          file=sys.stderr if args.file == "-" else sys.stdout)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from .tune_cache import store

    ok, skipped = store().patient().import_(Path(args.file))
    print(f"imported {ok} entries" + (f", skipped {skipped} invalid ones" if skipped else ""))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main()


# -- parser -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="opselect",
        description="GPU tensor ops with several algorithms each, and a dispatcher that picks the "
                    "fastest. This tool fills, shows and moves the tune cache the dispatcher reads.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", help="the tune cache directory (default: $OPSELECT_CACHE_DIR or "
                                       "~/.cache/opselect)")
    p.add_argument("--debug", action="store_true",
                   help="on an error, show Python's traceback too (not only the one-line message)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True,
                           parser_class=_Parser)

    def call_args(sp: argparse.ArgumentParser, *, many: bool) -> None:
        sp.add_argument("--shapes", action="append", type=_parse_shapes, metavar="SHAPES",
                        help="shapes of the tensor arguments, e.g. '16777216;1024' or 64x128000"
                             + (" (repeat for several cases)" if many else ""))
        sp.add_argument("--dtype", action="append", metavar="DTYPE",
                        help="torch dtype name, e.g. int32, bfloat16" + (" (repeatable)" if many else ""))
        sp.add_argument("--opt", action="append", type=_parse_opt, metavar="KEY=VALUE",
                        help="an op option, e.g. k=50, dim=0, invert=true, values=narrow (repeatable)")
        sp.add_argument("--device", help="device to run on (default: cuda if present, else cpu)")

    w = sub.add_parser("warm", help="measure the candidates for given shapes and fill the cache",
                       description="Measure every backend for each shape of a spec file (YAML or "
                                   "JSON list of {op, shapes | cases, dtypes, options}) or of the "
                                   "flags, writing each result to the cache as soon as it is "
                                   "measured; ends with the chosen backend and its speedup over "
                                   "torch per shape.")
    w.add_argument("spec", nargs="*", help="spec files (.yaml, .yml or .json)")
    w.add_argument("--op", help="op to warm from flags instead of (or besides) a spec")
    w.add_argument("--shards", "--gpus", type=int, default=None, metavar="N",
                   help="warm with N worker processes, one per GPU (round-robin over the "
                        "items; one process writes the cache at the end)")
    call_args(w, many=True)
    w.set_defaults(fn=cmd_warm)

    s = sub.add_parser("show", help="list the cache's entries", description="List the tune cache: "
                       "per op and key the best backend, its time, torch's time and the software "
                       "each record was measured under; then any calibration. Waits up to "
                       "5 s for another process's lock, and says so.")
    s.add_argument("--op", help="only this op")
    s.add_argument("--limit", type=int, default=50, metavar="N",
                   help="show at most N records (default 50; 0: all), then how many more there "
                        f"are; past {SHOW_TABLE_ROWS} rows, tab-separated lines instead of a table")
    s.set_defaults(fn=cmd_show)

    e = sub.add_parser("explain", help="show how a call would be dispatched and why",
                       description="Build random inputs of the given shapes and show every "
                                   "candidate's supports() verdict, predicted and measured time, "
                                   "the choice and where it came from.")
    e.add_argument("op", help="op name, e.g. isin")
    call_args(e, many=False)
    e.add_argument("--backend", help="force this backend (explains the forced path)")
    from .heuristics.device_model import KNOWN_GPUS

    e.add_argument("--what-if", metavar="GPU", help="ask the cost model for a GPU you do not have "
                                                    f"({', '.join(KNOWN_GPUS)}): no device needed")
    e.set_defaults(fn=cmd_explain)

    c = sub.add_parser("calibrate", help="measure this GPU's cost-model constants",
                       description="Measure bandwidth, launch and sync latency, random-load, atomic, "
                                   "compare and sort throughputs, then fit one correction per "
                                   "backend on each op's calibration shapes; stored in the cache.")
    c.add_argument("--device", help="CUDA device (default cuda)")
    c.add_argument("--no-fit", action="store_true", help="constants only, no per-backend fit")
    c.set_defaults(fn=cmd_calibrate)

    cl = sub.add_parser("clear", help="delete cache entries", description="Delete the tune "
                        "cache's entries (all, or one op's): rows of its database only, never "
                        "another file. Without --yes it asks; no answer deletes nothing (exit 1).")
    cl.add_argument("--op", help="only this op's entries")
    cl.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    cl.set_defaults(fn=cmd_clear)

    ex = sub.add_parser("export", help="write the cache to one JSON file",
                        description="Write every valid cache entry to a JSON file (one entry per "
                                    "line), to move a tuned cache to another machine. An existing "
                                    "file is replaced atomically; a device, FIFO, link or "
                                    "directory is refused.")
    ex.add_argument("file", help="the file to write, or - for standard output")
    ex.set_defaults(fn=cmd_export)

    im = sub.add_parser("import", help="load entries from an exported JSON file",
                        description="Load an exported JSON file into the cache in one "
                                    "transaction; every record is validated, invalid ones are "
                                    "skipped. The file is bounded: 256 MiB, 1,000,000 entries, "
                                    "nesting 32 deep.")
    im.add_argument("file")
    im.set_defaults(fn=cmd_import)

    d = sub.add_parser("demo", help="a short tour: automatic choice, forcing, explain, tuning",
                       description="A short tour of automatic selection: the choice for a call and "
                                   "why (explain), a forced backend, a backend that cannot take a "
                                   "call, tuning mode, and what the cost model would pick on an "
                                   "H200. Runs on a GPU, or on the CPU through Triton's "
                                   "interpreter (TRITON_INTERPRET=1).")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done; 1 a runtime failure (the cache cannot be written, an op failed); 2 a
    usage mistake (a bad flag, file, shape, dtype or device); 130 interrupted (what finished is
    kept). Every error is one line on stderr, every warning too; --debug adds the traceback."""
    as_command = argv is None  # the console script: warnings at exit are the command's too
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    if debug:
        return _main(argv, debug)
    # A warning is one line for a command-line user: its text, not the Python source line that
    # raised it. (formatwarning, not showwarning: code that records warnings still sees them.)
    plain, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:
        return _main(argv, debug)
    finally:
        if not as_command:
            warnings.formatwarning = plain


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def _main(argv: list[str], debug: bool) -> int:
    from .errors import CacheError, OpselectError

    command = "opselect"
    try:
        args = build_parser().parse_args(argv)
        command = f"opselect {args.command}"
        if args.cache_dir:
            os.environ["OPSELECT_CACHE_DIR"] = args.cache_dir
        return int(args.fn(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - every error is one line, unless --debug
        if debug:
            raise
        if isinstance(exc, (CacheError, OSError)):  # a runtime failure, not the user's mistake
            code, message = 1, str(exc)
        elif isinstance(exc, OpselectError):  # a usage mistake: a flag, file, shape, dtype
            code, message = 2, str(exc)
        else:
            first = str(exc).splitlines()[0] if str(exc) else ""
            code, message = 1, (f"{type(exc).__name__}: {first} (an internal error: run with "
                                "--debug for the traceback)")
    print(f"{command}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
