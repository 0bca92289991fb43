"""Tools at the edge: the functions a model may call during a call, and the call control they act on."""
