"""One conversation's runtime: the session runner, silence continuation, ledger, limits, local backend."""
