"""Rewards served elsewhere: the wire format, the transport every remote call uses, the remote
reward, record and replay, the reward server app and the servers a run launches itself."""
