"""The sandbox that runs environment code: `host.Sandbox` on the worker's side, `runner.py` and
`confine.py` inside it, started by `launch.py` (docs/SANDBOX.md).
"""
