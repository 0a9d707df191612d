"""gatewayd's benchmark: `python -m bench.run` measures gatewayd side by side with its floors.

Modules: `wire` (what goes on the wire), `floor` (the minimal aiohttp endpoint, its own process),
`procs` (spawning servers and reading /proc), `driver` (the load driver and the call targets),
`run` (the one command: rounds, memory, launch time, the table and the JSON record).
"""
