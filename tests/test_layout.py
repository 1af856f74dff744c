"""The seams of the package: imports point one way (no cycle, each layer imports only those below
it), Lightning's private API is touched in one module only, and the documentation of the layout,
the options and the config paths matches the tree."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import yaml

from repro.arguments import field_docs

from conftest import MODELS, REPO_ROOT

PACKAGE = REPO_ROOT / "repro"
README = (REPO_ROOT / "README.md").read_text()
DOCS = REPO_ROOT / "docs"
DOC_TEXT = README + "".join(p.read_text() for p in sorted(DOCS.glob("*.md")))  # the README and every page

# The layers of DESIGN.md, lowest first: a module may import its own layer's package and lower layers.
LAYERS = [
    {"repro.argument_errors"},  # jsonargparse's error wording, under the parser that uses it
    {
        "repro.files",
        "repro.paths",
        "repro.stats",
        "repro.arguments",
        "repro.stop",
        "repro.compile_option",
        "repro.deferred_init",
        "repro.network",
        "repro.cores",
    },
    {"repro.lightning_compat"},  # every private Lightning touch (it forwards stops: repro.stop)
    {"repro.models", "repro.data", "repro.pipeline"},  # siblings: none imports another
    {"repro.lit", "repro.pipeline.lightning"},
    {"repro.runs"},
    {"repro.alloc"},
    {"repro.experiments", "repro.results"},
    {"repro.cli", "repro"},
]
# imports allowed between siblings of one layer: none (DESIGN.md: the modules know nothing of the
# pipeline, the pipeline no concrete model; lit and pipeline.lightning meet only through Lightning)
SIBLINGS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every repro module a file imports (anywhere in it), with the line."""
    tree = ast.parse(path.read_text())
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names if alias.name.startswith("repro")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("repro"):
                submodules = [
                    target + "." + a.name
                    for a in node.names
                    if (PACKAGE.parent / (target + "." + a.name).replace(".", "/"))
                    .with_suffix(".py")
                    .is_file()
                ]
                # `from .pkg import module` loads the module (the package is already loading), not __init__ again
                out += [(m, node.lineno) for m in submodules] or [(target, node.lineno)]
    return out


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        edges[name] = {t for t, _ in imports_of(path) if t in MODULES and t != name}
    return edges


def layer_of(module: str) -> tuple[int, str]:
    best = (-1, "")
    for rank, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[1]):
                best = (rank, prefix)
    return best


def test_there_is_no_import_cycle_inside_repro():
    edges = graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_point_down_the_layers():
    wrong = []
    for name, path in MODULES.items():
        rank, prefix = layer_of(name)
        for target, line in imports_of(path):
            t_rank, t_prefix = layer_of(target)
            if t_rank < rank or t_prefix == prefix or name == "repro":
                continue
            if (prefix, t_prefix) in SIBLINGS and t_rank == rank:
                continue
            wrong.append(f"{path.relative_to(REPO_ROOT)}:{line} ({prefix}) imports {target} ({t_prefix})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_pipeline_knows_no_model():
    """Nothing under repro.pipeline (its Lightning strategy included) imports repro.models or repro.lit:
    a model reaches the pipeline only through its stage adapter and its LightningModule's hooks."""
    wrong = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {target}"
        for name, path in MODULES.items()
        if name.startswith("repro.pipeline")
        for target, line in imports_of(path)
        if target.startswith(("repro.models", "repro.lit"))
    ]
    assert not wrong, wrong


def test_experiments_never_import_each_other():
    """Each experiment imports only itself and the shared kit; the kit imports no experiment."""
    wrong = []
    for name, path in MODULES.items():
        if not name.startswith("repro.experiments."):
            continue
        own = name.split(".")[2]
        for target, line in imports_of(path):
            if target.startswith("repro.experiments.") and target.split(".")[2] not in (own, "kit"):
                wrong.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {target}")
    assert not wrong, wrong


def test_lightning_private_api_is_imported_only_by_the_compat_module():
    compat = PACKAGE / "lightning_compat.py"
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "lightning",
                "pytorch_lightning",
                "lightning_fabric",
            ):
                private = [a.name for a in node.names if a.name.startswith("_")]
                private += [part for part in node.module.split(".") if part.startswith("_")]
                if private and path != compat:
                    wrong.append(
                        f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {private} from {node.module}"
                    )
    assert not wrong, "private Lightning imports outside lightning_compat.py:\n" + "\n".join(wrong)


def test_the_private_lightning_symbols_the_compat_module_needs_exist():
    from repro import lightning_compat as compat

    assert compat.missing_symbols() == [], "Lightning moved these; update repro/lightning_compat.py"


def test_the_model_summary_prints_no_flops_line_it_did_not_measure():
    """Lightning's summary says 'Total Flops' 0 for any module without an example input (every module
    of the suite); the suite's summary leaves that line out and keeps it where a count exists."""
    import logging

    from repro import lightning_compat as compat

    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch.callbacks.model_summary")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # other tests quiet Lightning's loggers
    try:
        for flops in (0, 1234):
            columns = [(" ", ["0"]), ("Name", ["gpt"]), ("FLOPs", [str(flops)])]
            compat.ModelSummary.summarize(columns, 10, 10, 0.0, {"train": 1, "eval": 0}, flops)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    unmeasured, measured = messages
    assert "Total params" in unmeasured and "Flops" not in unmeasured and "FLOPs" not in unmeasured
    assert "Total Flops" in measured and "1.2 K" in measured and "FLOPs" in measured


def test_no_module_is_much_longer_than_300_lines():
    long = {
        str(p.relative_to(REPO_ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


# ------------------------------------------------------------------------------------------- documentation
def readme_layout() -> str:
    return (DOCS / "layout.md").read_text().split("```", 2)[1]


def test_the_readme_is_a_landing_page_whose_links_exist():
    assert len(README.splitlines()) < 300
    links = re.findall(r"\]\(((?:docs/)?[A-Za-z0-9_./]+\.md)(?:#[a-z0-9-]+)?\)", README)
    assert {"docs/table1.md", "docs/clapping.md", "docs/layout.md"} <= set(links)
    missing = [link for link in links if not (REPO_ROOT / link).is_file()]
    for page in DOCS.glob("*.md"):  # and the pages' links to each other
        for link in re.findall(r"\]\(([A-Za-z0-9_./]+\.md)(?:#[a-z0-9-]+)?\)", page.read_text()):
            if not ((DOCS / link).is_file() or (REPO_ROOT / link).is_file()):
                missing.append(f"{page.name} -> {link}")
    assert not missing, missing


def test_the_readmes_first_screen_shows_a_figure_the_two_commands_and_the_results_and_no_block_is_long():
    """The first 50 lines: a figure, `make reproduce-table1 SCALE=smoke` and `make test`, and the head
    of the results table; below, no paragraph or bullet over six lines, no prose line over 200."""
    lines = README.splitlines()
    first = "\n".join(lines[:50])
    assert "![" in first, "the README's first screen shows no figure"
    assert "make reproduce-table1 SCALE=smoke" in first and "\nmake test " in first
    assert re.search(r"^\| claim \| verdict \|", first, re.M), "no results table on the first screen"
    blocks, block, fenced = [], [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            continue
        prose = not fenced and line.strip() and not line.startswith(("|", "#", "![", "*`"))
        if prose and block and line.startswith("- "):  # a new bullet ends the one above it
            blocks.append(block)
            block = []
        if prose:
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    blocks.append(block)
    long_blocks = [b[0][:60] for b in blocks if len(b) > 6]
    assert not long_blocks, f"README paragraphs or bullets over six lines: {long_blocks}"
    wide = [line[:60] for b in blocks for line in b if len(line) > 200]
    assert not wide, f"README prose lines over 200 characters: {wide}"


def test_every_embedded_figure_exists_is_small_and_its_caption_names_a_command():
    """An image in the README or docs is a committed PNG under docs/figures/ (under 200 KB), and the
    line under it is a caption naming the command (in backticks) and the commit of its results."""
    pages = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    problems, shown = [], 0
    for page in pages:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", line):
                shown += 1
                path = (page.parent / target).resolve()
                if path.parent != (DOCS / "figures").resolve() or not path.is_file():
                    problems.append(f"{page.name}: {target} is not a file under docs/figures/")
                elif path.stat().st_size > 200_000:
                    problems.append(f"{page.name}: {target} is {path.stat().st_size:,} bytes")
                caption = lines[i + 1] if i + 1 < len(lines) else ""
                if not re.search(r"`(make|repro) [^`]+`", caption) or not re.search(
                    r"`[0-9a-f]{7,}`", caption
                ):
                    problems.append(
                        f"{page.name}: {target}'s caption names no command and commit: {caption!r}"
                    )
    assert not problems, problems
    assert shown, "no page shows a figure"


def test_the_layout_page_names_every_package_and_module():
    layout = readme_layout()
    missing = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and p.stem not in layout
    ]
    missing += [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and f"{p.parent.name}/" not in layout
    ]
    assert not missing, f"docs/layout.md does not mention {missing}"
    named = set(re.findall(r"\b([a-z_0-9]+)\.py\b", layout))
    existing = {p.stem for p in REPO_ROOT.rglob("*.py") if ".venv" not in p.parts}
    assert named <= existing, f"docs/layout.md names files that do not exist: {sorted(named - existing)}"


def test_every_config_path_in_the_readme_and_docs_exists():
    paths = set(re.findall(r"paper_configs/[A-Za-z0-9_/.<>{},|-]+\.yaml", DOC_TEXT))
    missing = [p for p in sorted(paths) if "<" not in p and "{" not in p and not (REPO_ROOT / p).is_file()]
    assert not missing, f"the README or docs name config files that do not exist: {missing}"


def test_every_strategy_option_is_in_the_pipeline_config_and_the_strategy_page():
    from repro.pipeline.options import PipelineOptions

    options = [f.name for f in dataclasses.fields(PipelineOptions) if f.init]
    listed = yaml.safe_load((MODELS / "smoke" / "pipeline.yaml").read_text())["trainer"]["strategy"][
        "init_args"
    ]
    assert set(listed) == set(options)
    table = "\n".join(
        line
        for line in (DOCS / "strategy.md").read_text().split("**Options**", 1)[1].splitlines()[:40]
        if line.startswith("| `")
    )
    missing = [name for name in options if f"`{name}`" not in table]
    assert not missing, f"docs/strategy.md options table lacks {missing}"
    assert set(field_docs(PipelineOptions)) >= set(options)


def test_the_strategy_signature_is_the_options_names_types_and_defaults():
    """ClappingStrategy's explicit __init__ (what LightningCLI and --help read) takes every option of
    PipelineOptions, keyword only, with its annotation and default, and Lightning's own arguments."""
    import inspect

    from repro.pipeline.lightning import ClappingStrategy
    from repro.pipeline.options import PipelineOptions

    params = inspect.signature(ClappingStrategy.__init__).parameters
    options = {f.name: f for f in dataclasses.fields(PipelineOptions) if f.init}
    kw = {n: p for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert list(kw) == list(options)
    hints, types = typing.get_type_hints(ClappingStrategy.__init__), typing.get_type_hints(PipelineOptions)
    for name, field in options.items():
        assert kw[name].default == field.default, name
        assert hints[name] == types[name], name
    lightning = [
        "accelerator",
        "parallel_devices",
        "cluster_environment",
        "checkpoint_io",
        "precision_plugin",
    ]
    assert [n for n in params if n not in kw and n != "self"] == lightning
    assert all(f"    {name}: " in ClappingStrategy.__init__.__doc__ for name in options)  # --help


@pytest.mark.parametrize(
    "module, cls",
    [
        ("repro.experiments.table1.settings", "Table1Settings"),
        ("repro.experiments.clapping.settings", "ClappingSettings"),
        ("repro.experiments.bench.settings", "BenchSettings"),
        ("repro.pipeline.options", "PipelineOptions"),
        ("repro.lit.gpt_module", "OptimConfig"),
        ("repro.models.config", "GPTConfig"),
    ],
)
def test_every_option_has_a_docstring(module, cls):
    import importlib

    klass = getattr(importlib.import_module(module), cls)
    names = [f.name for f in dataclasses.fields(klass) if f.init and f.name != "path"]
    comments = field_docs(klass)
    assert [n for n in names if not comments.get(n)] == []


STALE_NAMES = (
    "pipeline_parts(",  # the stage adapter's parts() now
    "pipeline_input",
    "pipeline_loss",
    "smoke_pipeline.yaml",  # paper_configs/models/smoke/pipeline.yaml
    "repro.pipeline.ClappingStrategy",  # repro.pipeline.lightning.ClappingStrategy
    "paper_configs/smoke.yaml",
    "paper_configs/table1/",
    "cache_dir/tokens",  # token streams are shards now
)


def test_no_stale_names_in_the_code_or_the_docs():
    """Names of earlier layouts, in messages a user reads or in the docs, point to nothing."""
    found = []
    for path in [*PACKAGE.rglob("*.py"), REPO_ROOT / "README.md", *DOCS.glob("*.md")]:
        text = path.read_text()
        found += [f"{path.relative_to(REPO_ROOT)}: {name}" for name in STALE_NAMES if name in text]
    assert not found, found


OTHER_TOOLS_OPTIONS = {  # options of pip, torchrun and SLURM that the docs' recipes pass
    "--no-deps", "--index-url", "--system-site-packages", "--disable-pip-version-check",
    "--nproc-per-node", "--node-rank", "--master-addr", "--master-port",
    "--ntasks-per-node", "--gpus-per-node", "--cpus-per-task",
}  # fmt: skip


def test_the_docs_spell_every_option_as_the_commands_do():
    """One spelling everywhere (LightningCLI's ``--full_steps``): no README, docs page, Makefile or
    config comment shows a repro option with a dash inside its name (a command refuses it)."""
    texts = [REPO_ROOT / "README.md", REPO_ROOT / "Makefile", REPO_ROOT / "PROTOCOL.md"]
    texts += [*(REPO_ROOT / "docs").glob("*.md"), *(REPO_ROOT / "paper_configs").rglob("*.yaml")]
    dashed = {
        f"{path.relative_to(REPO_ROOT)}:{n}: {option}"
        for path in texts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "is refused in" not in line  # the sentence that shows the old spelling
        for option in re.findall(r"--[a-z]+(?:-[a-z0-9]+)+", line)
        if option not in OTHER_TOOLS_OPTIONS
    }
    assert not dashed, sorted(dashed)
