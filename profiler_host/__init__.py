"""The in-process profiler (rewriter, hooks, sampling, transport): built in issue 3."""
