"""The README and docs/ stay true: their Python parses, their links lead somewhere, the front page's loop
runs, and the architecture page names every module there is (and none that is gone)."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from amp_inspect.cli.argtypes import DEMO_STEPS, DEMO_TROUBLE_FROM

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _load_figures_script():
    """docs/regenerate_demo_figures.py, which is a script (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        "regenerate_demo_figures", ROOT / "docs" / "regenerate_demo_figures.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIGURES = _load_figures_script()


def python_blocks(page: Path) -> list[str]:
    return CODE_BLOCK.findall(page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_parse(page: Path) -> None:
    for block in python_blocks(page):
        # Snippets may continue a loop shown above them: indented lines are parsed as the body of one.
        source = block if not block.startswith((" ", "\t")) else "for _ in []:\n" + block
        try:
            ast.parse(source)
        except SyntaxError as e:
            pytest.fail(f"{page.name}: a python block does not parse ({e.msg}, line {e.lineno}):\n{block}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(page: Path) -> None:
    text = page.read_text()
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_nothing_points_outside_the_repository() -> None:
    for page in PAGES:
        assert "../shared" not in page.read_text(), page


def test_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 10 * 1024


def test_readme_commands_run_from_the_clone_without_an_activated_venv() -> None:
    """The README's shell lines run as written after `make demo`, in the clone's root: the package's command is
    spelled .venv/bin/amp-inspect (make demo installs it there; nothing puts it on PATH)."""
    text = (ROOT / "README.md").read_text()
    shell = [
        line.strip()
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    bare = [line for line in shell if line.split()[0] in ("amp-inspect", "python")]
    assert not bare, f"README shell lines that need an activated venv: {bare}"
    assert any(line.startswith(".venv/bin/amp-inspect ") for line in shell)


def test_readme_loop_runs_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front page's loop, with "cuda" read as "cpu" (bf16 autocast there), on a small model."""
    loop = python_blocks(ROOT / "README.md")[0]
    assert "amp_inspect.attach(model, scaler" in loop and "insp.check()" in loop
    monkeypatch.chdir(tmp_path)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    namespace = {
        "torch": torch,
        "model": model,
        "loader": [torch.randn(4, 8) for _ in range(3)],
        "opt": torch.optim.SGD(model.parameters(), lr=0.1),
    }
    source = loop.replace('"cuda"', '"cpu"').replace("torch.float16", "torch.bfloat16")
    source = source.replace("model(batch)", "model(batch).float().pow(2).mean()")
    exec(compile(source, "README.md loop", "exec"), namespace)
    insp = namespace["insp"]
    assert [record.step for record in insp.history] == [0, 1, 2]
    assert (tmp_path / "run.jsonl").exists()
    insp.detach()


def test_architecture_names_every_module() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "amp_inspect"
    modules = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py") if p.name != "__init__.py"}
    modules |= {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").rglob("*") if p.suffix in {".h", ".cpp", ".cu", ".cuh"}
    }
    named = set(re.findall(r"`((?:amp_inspect|csrc)/[\w/]+\.\w+)`", page))
    assert not modules - named, f"docs/architecture.md does not name {sorted(modules - named)}"
    gone = sorted(name for name in named if not (ROOT / name).is_file())
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the demo as `make demo` runs it on a CPU (seconds), for the figures the docs quote."""
    from amp_inspect.cli.demo import run

    with contextlib.redirect_stdout(io.StringIO()):
        return run(out_dir=tmp_path_factory.mktemp("demo") / "amp_inspect_demo", device="cpu")


def test_demo_figures_in_the_docs_are_the_demo_s(demo_log: Path) -> None:
    for page, (now, measured) in FIGURES.rewritten_pages(demo_log).items():
        assert FIGURES.agree(now, measured), (
            f"{page} quotes stale demo figures: run .venv/bin/python docs/regenerate_demo_figures.py"
        )


def test_quoted_figures_may_differ_by_a_cpu_s_rounding_but_not_more() -> None:
    # The two CPUs' `amp-inspect updates` rows for one module (tests/test_docs.py's CI run on each).
    avx2 = "blocks.1.mlp.fc1      199,615     0.135%               6.19e-05"
    avx512 = "blocks.1.mlp.fc1      199,610    0.132%               6.19e-05"
    assert FIGURES.agree(avx2, avx512) and FIGURES.agree(avx512, avx2)
    assert not FIGURES.agree(avx2, avx2.replace("0.135%", "0.143%"))  # 5.6% away: the demo changed
    assert FIGURES.agree(avx2, avx2.replace("0.135%", "0.141%"))  # 4.3%: within
    assert not FIGURES.agree(avx2, avx2.replace("fc1", "fc2"))  # another module: a number in its name
    assert not FIGURES.agree(avx2, avx2.replace("%", " updates"))  # other words
    assert not FIGURES.agree("3 of 12 steps", "3 of 12 steps, 1 more")  # a number more


def test_figures_are_written_between_their_markers_only() -> None:
    text = "before\n<!-- demo:x -->\nold\n<!-- /demo:x -->\nafter <!-- demo:y -->9 of 12<!-- /demo:y --> end"
    assert FIGURES.rewrite(text, {"x": "new", "y": "3 of 4"}) == (
        "before\n<!-- demo:x -->\nnew\n<!-- /demo:x -->\nafter <!-- demo:y -->3 of 4<!-- /demo:y --> end"
    )
    with pytest.raises(ValueError, match="must hold the markers <!-- demo:z -->"):
        FIGURES.rewrite(text, {"z": "anything"}, "docs/usage.md")


def test_pages_tell_the_demo_s_length() -> None:
    for page in ("README.md", "docs/reports.md"):
        assert f"for {DEMO_STEPS} steps" in (ROOT / page).read_text(), page
    assert f"from step {DEMO_TROUBLE_FROM}" in (ROOT / "docs" / "reports.md").read_text()
