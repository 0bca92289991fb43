"""A tool module that does not import (its dependency is missing)."""

import duplex_agent_no_such_dependency  # noqa: F401
