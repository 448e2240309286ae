"""The package's layers, read from the source: the engine imports no Celery, and everything
outside the engine imports it only through its surface, ``celery_singleton_lock.engine``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "celery_singleton_lock"
ENGINE = PACKAGE / "engine"


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    parts = parts[:-1]  # relative imports start from the package (of a module, or __init__'s own)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_engine_imports_no_celery() -> None:
    for path in ENGINE.rglob("*.py"):
        celery_imports = {
            name
            for name in imported_modules(path)
            if name.split(".")[0] in ("celery", "kombu", "billiard")
            or name.startswith("celery_singleton_lock.celery")
        }
        assert not celery_imports, f"{path.name} imports {sorted(celery_imports)}"


def test_outside_the_engine_only_its_surface_is_imported() -> None:
    engine_modules = {f"celery_singleton_lock.engine.{p.stem}" for p in ENGINE.glob("*.py")}
    engine_modules.discard("celery_singleton_lock.engine.__init__")
    for path in PACKAGE.rglob("*.py"):
        if ENGINE in path.parents:
            continue
        reached = imported_modules(path) & engine_modules
        assert not reached, f"{path.relative_to(PACKAGE)} imports {sorted(reached)}"


def test_only_the_django_app_imports_django() -> None:
    # an app without Django gets nothing of it: the admin's page is an edge of the package
    django_app = PACKAGE / "contrib" / "django"
    for path in PACKAGE.rglob("*.py"):
        if django_app in path.parents:
            continue
        django_imports = {n for n in imported_modules(path) if n.split(".")[0] == "django"}
        assert not django_imports, f"{path.relative_to(PACKAGE)} imports {sorted(django_imports)}"
