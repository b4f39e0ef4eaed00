"""[host] What the person and the folder configured: the settings model and where each value comes
from, the settings files, the workspace files the host trusts, the variables a raw launch reads.
Imports no other sub-room.
"""
