"""Fixtures shared by the load tests."""

import pytest

from tests.kvplan.run.server.fake_server import FakeServer, Options


@pytest.fixture
def fake():
    """Start fake OpenAI-compatible servers (``fake(**Options fields)``); all are stopped after the test."""
    servers = []

    def start(**options):
        server = FakeServer(Options(**options)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
