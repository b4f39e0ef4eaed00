"""[host] Session(gateway_url=...): a worker behind a Jupyter Kernel Gateway. Imports the agent room's
worker, namespace and data plane, and the sub-rooms below agent.
"""
