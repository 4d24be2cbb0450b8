"""Reading the YAML files a user writes (study configs, task files): one safe loader for both.

[`load_yaml_with_lines`][headcount.runtime.yamlfile.load_yaml_with_lines] parses with ``yaml.SafeLoader`` only and refuses, in one line that
names the file and the line: a syntax error, a tag that is not plain data, a key that appears
twice in one mapping, an alias that refers to the value it is in, values nested too deeply, and
aliases that expand to more than [`MAX_VALUES`][headcount.runtime.yamlfile.MAX_VALUES] values ("billion laughs": nine anchors of
nine aliases each are a few hundred bytes and a billion values). The expanded size is counted
on the parsed nodes, each anchor once, before anything walks or builds the values: such a file is
refused at once instead of hanging.
"""

from __future__ import annotations

from typing import Any

import yaml

from headcount.runtime.errors import HeadcountError

__all__ = ["MAX_VALUES", "dotted", "load_yaml_with_lines"]

#: the most values (mapping keys, values and list items, each alias counted where it is used) a
#: YAML file may expand to: a study config or a task file holds hundreds
MAX_VALUES = 100_000


def dotted(path: tuple) -> str:
    """A key path as the error lines write it: ``('tasks', 1, 'seed')`` -> ``tasks[1].seed``.

    >>> dotted(("tasks", 1, "seed")), dotted(())
    ('tasks[1].seed', '(top level)')
    """
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_size(root: yaml.Node, where: str) -> None:
    """Refuse a document whose aliases expand it past [`MAX_VALUES`][headcount.runtime.yamlfile.MAX_VALUES] values, or refer to the
    value they are in; each node is counted once (an anchor's size is remembered), so the count
    takes as long as the file is, whatever the aliases would expand to."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:  # iterative: a deeply nested file does not exhaust Python's stack here
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > MAX_VALUES:
                raise HeadcountError(f"{where}, line {node.start_mark.line + 1}: the YAML expands to more than "
                                     f"{MAX_VALUES:,} values (aliases that repeat aliases); write the values out")
            size[key] = total
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise HeadcountError(f"{where}, line {node.start_mark.line + 1}: an alias refers to the value it is in "
                                 "(a value that contains itself)")
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise HeadcountError(f"{where}, line {child.start_mark.line + 1}: an alias refers to the value it "
                                     "is in (a value that contains itself)")
            if id(child) not in size:
                stack.append((child, False))


def _walk(node: yaml.Node, path: tuple, lines: dict[tuple, int], where: str) -> None:
    """Record the (1-based) line of every mapping key and sequence item; refuse duplicate keys."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if key in seen:
                raise HeadcountError(f"{where}, line {line}: key {dotted(path + (key,))!r} appears twice "
                                     f"(first on line {seen[key]})")
            seen[key] = line
            lines[path + (key,)] = line
            _walk(value_node, path + (key,), lines, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines, where)


def load_yaml_with_lines(text: str, where: str = "<config>") -> tuple[Any, dict[tuple, int]]:
    """Parse YAML safely and return ``(data, lines)``; ``lines[("a", 0, "b")]`` is a key's line.

    Raises:
        HeadcountError: a syntax error or a tag that is not plain data (with its line), a
            duplicated key, an alias bomb or an alias inside itself, values nested too deeply.

    >>> data, lines = load_yaml_with_lines("a: 1\\nb:\\n  - c: 2\\n")
    >>> data, lines[("b", 0, "c")]
    ({'a': 1, 'b': [{'c': 2}]}, 3)
    >>> load_yaml_with_lines("a: 1\\na: 2\\n", "t.yaml")
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: t.yaml, line 2: key 'a' appears twice (first on line 1)
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_size(node, where)
        lines: dict[tuple, int] = {(): node.start_mark.line + 1}
        _walk(node, (), lines, where)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = e.problem or e.context or "invalid YAML"
        raise HeadcountError(f"{where}{line}: not valid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise HeadcountError(f"{where}: not valid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise HeadcountError(f"{where}: values nested too deeply") from None
    finally:
        loader.dispose()
    return data, lines
