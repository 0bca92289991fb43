"""Imports point one way: contract <- protocol and models <- session and remote <- transports <- app."""

from tests.packaging.import_graph import find_cycle, import_edges, module_files, package_of


def test_no_module_imports_another_that_imports_it_back():
    assert find_cycle(import_edges()) is None


def test_no_package_cycle():
    files = module_files()
    packages: dict[str, set[str]] = {}
    for module, targets in import_edges().items():
        here = package_of(module, files)
        packages.setdefault(here, set()).update(package_of(t, files) for t in targets if package_of(t, files) != here)
    assert find_cycle(packages) is None


def test_layers_point_down():
    """A lower layer never imports a higher one (the design notes' layout)."""
    layers = [
        ("duplex_agent.plugins.contract",),
        ("duplex_agent.agent.protocol", "duplex_agent.agent.models", "duplex_agent.plugins"),
        ("duplex_agent.agent.session", "duplex_agent.agent.remote"),
        ("duplex_agent.webrtc",),
        # the LiveKit Agents model sits over the call path and the backends, beside the app
        ("duplex_agent.agent.app", "duplex_agent.livekit_agents"),
    ]

    def layer(module: str) -> int | None:
        best = None
        for index, prefixes in enumerate(layers):
            for prefix in prefixes:
                matches = module == prefix or module.startswith(prefix + ".")
                if matches and (best is None or len(prefix) > best[1]):
                    best = (index, len(prefix))
        return None if best is None else best[0]

    upward = [(m, t) for m, targets in import_edges().items() for t in targets
              if layer(m) is not None and layer(t) is not None and layer(t) > layer(m)]  # type: ignore[operator]
    assert upward == []


def test_the_graph_sees_imports():
    """The checks above are only worth something if the graph finds real edges."""
    edges = import_edges()
    assert "duplex_agent.plugins.contract" in edges["duplex_agent.agent.session.runner"]
    assert "duplex_agent.plugins.contract.types" in edges["duplex_agent.plugins.contract.engine"]
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
