"""Every Celery task is named after the one service it calls, so a name found in beat's schedule,
a queue or a log leads straight to the code that runs."""

import ast

from tools import importgraph


def _tasks() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for module, path in importgraph.module_files():
        if module.endswith(".tasks") and importgraph.app_of(module) not in importgraph.NOT_APPS:
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and any(
                    "shared_task" in ast.unparse(d) for d in node.decorator_list
                ):
                    found.append((module, node))
    return found


def _calls(function: ast.FunctionDef) -> set[str]:
    return {
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }


def test_every_task_calls_a_service_of_its_own_name():
    tasks = _tasks()
    assert len(tasks) >= 10  # jobs, metering and operations each have tasks
    misnamed = [f"{module}.{fn.name}" for module, fn in tasks if fn.name not in _calls(fn)]
    assert not misnamed, f"tasks that call no service of their name: {misnamed}"
