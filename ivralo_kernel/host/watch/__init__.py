"""[host] Watching a running kernel from outside: the watchdog and its deadline, memory and broker
handlers, the observer, the process tree, the watchdog's own channels. Imports the sub-rooms below
it (settings, sandbox, broker, history).
"""
