"""Imports point one way: no module, and no app, imports another that imports it back.

The graph is drawn from source with ``ast`` (tools/importgraph.py), imports at any depth
counting, hidden inside functions too; only ``if TYPE_CHECKING:`` and ``AppConfig.ready`` are exempt.
"""

import textwrap

from tools import importgraph

APP_CODE = (
    "accounts",
    "common",
    "e31cli",
    "e31web",
    "jobs",
    "metering",
    "notifications",
    "operations",
    "public",
)


def _loops(arrows, groups) -> str:
    return "; ".join(" -> ".join(importgraph.shortest_loop(g, arrows)) for g in groups)


def test_no_module_imports_one_that_imports_it_back():
    graph = importgraph.build()
    arrows = graph.arrows()
    found = importgraph.cycles(arrows)
    assert not found, f"import cycles between modules: {_loops(arrows, found)}"


def test_no_app_imports_one_that_imports_it_back():
    apps = importgraph.app_graph(importgraph.build())
    found = importgraph.cycles(apps)
    assert not found, f"import cycles between apps: {_loops(apps, found)}"


def test_no_app_module_hides_an_import_inside_a_function():
    hidden = [i for i in importgraph.build().hidden() if importgraph.app_of(i.source) in APP_CODE]
    assert not hidden, "imports inside functions: " + ", ".join(f"{i.source}:{i.line}" for i in hidden)


def test_every_package_of_the_product_is_checked_for_hidden_imports():
    """A package left out of APP_CODE (public, common and e31cli were) would hide imports unseen."""
    packages = {path.parent.name for path in importgraph.ROOT.glob("*/__init__.py")}
    assert packages - importgraph.NOT_APPS == set(APP_CODE)


def _tree(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return importgraph.build(tmp_path)


def test_a_loop_through_an_import_hidden_in_a_function_is_found(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "shop/__init__.py": "",
            "shop/orders.py": "from shop import bell\n",
            "shop/bell.py": "def ring():\n    from shop import orders\n",
            "shop/tasks.py": "from shop import orders\n",
        },
    )
    assert importgraph.cycles(graph.arrows()) == [["shop.bell", "shop.orders"]]
    assert [(i.source, i.target) for i in graph.hidden()] == [("shop.bell", "shop.orders")]


def test_type_checking_blocks_and_appconfig_ready_are_exempt(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "shop/__init__.py": "",
            "shop/apps.py": """
                from django.apps import AppConfig
                class ShopConfig(AppConfig):
                    def ready(self):
                        from billing import receivers
                    def other(self):
                        pass
            """,
            "shop/models.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from billing.models import Invoice
                else:
                    from shop import apps
            """,
            "billing/__init__.py": "",
            "billing/models.py": "from shop.models import *\n",
            "billing/receivers.py": "from shop import models\n",
        },
    )
    assert importgraph.cycles(graph.arrows()) == []
    assert {(i.source, i.target) for i in graph.imports} == {
        ("shop.models", "shop.apps"),
        ("billing.models", "shop.models"),
        ("billing.receivers", "shop.models"),
    }


def test_apps_that_import_each_other_are_named(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "shop/__init__.py": "",
            "shop/views.py": "from billing import budgets\n",
            "billing/__init__.py": "",
            "billing/budgets.py": "from ..shop import views\n",
        },
    )
    assert importgraph.cycles(importgraph.app_graph(graph)) == [["billing", "shop"]]
    assert "billing, shop" in importgraph.summary(graph)
