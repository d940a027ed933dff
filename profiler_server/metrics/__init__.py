"""Prometheus metrics: aggregated profiles (profiles.py) and the server's health (health.py).

`_created` series are disabled (process-wide, when this package is first imported, so before
any server builds its registry): they double the series count of every counter and histogram
and Prometheus does not need them.
"""

from prometheus_client import disable_created_metrics

disable_created_metrics()
