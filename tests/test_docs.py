"""The documentation against the code it describes: the README stays a short tour whose links lead
to files in the repository, the CLI reference is what scripts/gen_cli_reference.py makes of the
parser today (so it cannot drift from --help), and docs/configuration.md lists exactly the KL_*
variables kilolock/ reads. Links between the docs/ pages are checked by `mkdocs build --strict`
(scripts/test.sh)."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from kit.paths import REPO

README_MAX_LINES = 300
# [text](target) in Markdown, the target up to a space or the closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", REPO / "scripts" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short_and_opens_with_the_two_commands() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the limit is {README_MAX_LINES}: move detail to docs/"
    # CI runs the test command the README opens with (.ci/run); the demo is the first thing a newcomer runs.
    assert lines[3:5] == [
        "bash scripts/demo.sh     # the main job on a fresh machine: a real refresh of a Terraform-made state, on the embedded database",
        "bash scripts/test.sh     # the tests: installs what they need, runs the linters, pytest and the benchmark ratio gates",
    ]


def _readme_kl_commands() -> list[str]:
    """The `kl ...` lines of the README's shell blocks (the tour a newcomer copies), each cut at its
    comment and before a redirection or pipe."""
    import shlex

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", readme, re.DOTALL):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["kl"]:
                cut = next((i for i, w in enumerate(words) if w in (">", ">>", "|", "&&")), len(words))
                commands.append(shlex.join(words[1:cut]))
    return commands


def test_the_tours_commands_parse_with_todays_parser() -> None:
    """A renamed option or command breaks the tour where a newcomer meets it first: each line must
    parse as kl would parse it (nothing is run)."""
    import shlex

    from kilolock.cli import _parser_for

    commands = _readme_kl_commands()
    assert len(commands) >= 15, commands
    refused = []
    for command in commands:
        parser, argv = _parser_for(shlex.split(command))
        try:
            parser.parse_args(argv)
        except Exception as exc:  # noqa: BLE001 - any refusal is the finding, with its message
            refused.append(f"kl {command}: {exc}")
    assert not refused, refused


def _local_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]


def test_the_readmes_links_resolve_to_files_in_the_repository() -> None:
    links = _local_links(REPO / "README.md")
    assert links, "the README links into docs/"
    broken = []
    for target in links:
        path = (REPO / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            broken.append(target)
    assert not broken, f"README.md links to what a clone does not have: {broken}"


def test_no_page_links_outside_the_repository() -> None:
    """mkdocs checks links between pages; one that climbs out of the repository (a design document
    beside the clone) would only be a warning there if it happened to exist."""
    outside = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for target in _local_links(page):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(REPO):
                outside.append(f"{page.relative_to(REPO)}: {target}")
    assert not outside, outside


def test_the_cli_reference_is_what_the_parser_generates() -> None:
    committed = (REPO / "docs" / "cli" / "reference.md").read_text(encoding="utf-8")
    assert committed == _generator().render(), \
        "docs/cli/reference.md differs from the parser: run .venv/bin/python scripts/gen_cli_reference.py"


def test_every_command_has_a_reference_entry() -> None:
    from kilolock.cli.commands import COMMANDS, DRIFT_ACCEPT, DRIFT_IGNORE, Command

    def leaves(prefix: str, command: Command) -> list[str]:
        words = f"{prefix} {command.name}".strip()
        return [w for a in command.actions for w in leaves(words, a)] if command.actions else [words]

    commands = [w for c in COMMANDS for w in leaves("", c)] + leaves("drift", DRIFT_IGNORE) + leaves("drift", DRIFT_ACCEPT)
    assert {"refresh", "state import", "drift ignore add", "drift accept", "access trust oidc"} <= set(commands)
    headings = set(re.findall(r"^## kl (.+)$", (REPO / "docs" / "cli" / "reference.md").read_text(encoding="utf-8"), re.MULTILINE))
    missing = [c for c in commands if c not in headings]
    assert not missing, f"commands without an entry in docs/cli/reference.md: {missing}"


def _variables_the_code_reads() -> set[str]:
    """Every string constant in kilolock/ that is a KL_* name: os.environ.get("KL_X"), a constant
    such as POOLER_ENV = "KL_DATABASE_POOLER", env_choice("KL_READ_PATH", ...)."""
    names = set()
    for source in (REPO / "kilolock").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"KL_[A-Z0-9_]+", node.value):
                names.add(node.value)
    return names


def _variables_the_table_lists() -> set[str]:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = page.split("## Every setting", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(KL_[A-Z0-9_]+)` \|", table, re.MULTILINE))


def test_the_configuration_table_lists_every_variable_the_code_reads() -> None:
    read, listed = _variables_the_code_reads(), _variables_the_table_lists()
    assert {"KL_DATABASE_URL", "KL_LOG", "KL_DATABASE_POOLER"} <= read  # the scan finds them all three ways
    assert not read - listed, f"KL_* variables kilolock/ reads that docs/configuration.md's table lacks: {sorted(read - listed)}"
    assert not listed - read, f"KL_* variables docs/configuration.md lists that kilolock/ no longer reads: {sorted(listed - read)}"
