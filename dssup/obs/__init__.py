"""Observability shared by the supervisor and the webhook: logs (text or JSON) and metrics."""

from dssup.obs.log import configure_logging, get_logger
from dssup.obs.metrics import Metrics, NullMetrics, PrometheusMetrics

__all__ = ["Metrics", "NullMetrics", "PrometheusMetrics", "configure_logging", "get_logger"]
