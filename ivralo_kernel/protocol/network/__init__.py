"""[protocol] What both sides know of the network: the egress policy's file format, how names are
normalized and judged, and the proxy's request parsing.
"""
