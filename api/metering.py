"""Per-request measurements for /metrics (and the token-per-minute limits): one Meter per
generation request, fed by the view as the engine's events pass (accepted, each text delta, the
end). Times are from the request's arrival, so time to first token includes the queue wait.
The request's token reservation (api.limits) is settled exactly once: at the end against what the
generation used, or with nothing (release()) when the engine never took it."""
import time

from api import limits
from api.projectors import Choices, Projector
from colibri_base import metrics


class Meter:
    def __init__(self, surface: str, *, reservation: limits.Reservation | None = None) -> None:
        self.surface = surface
        self.reservation = reservation or limits.Reservation()  # tokens charged at admission
        self.t0 = time.monotonic()
        self.last: float | None = None
        self.ended = False

    def accepted(self) -> None:
        metrics.QUEUE_WAIT.labels(self.surface).observe(time.monotonic() - self.t0)

    def text(self) -> None:
        now = time.monotonic()
        if self.last is None:
            metrics.TTFT.labels(self.surface).observe(now - self.t0)
        else:
            metrics.INTER_TOKEN.labels(self.surface).observe(now - self.last)
        self.last = now

    def end(self, projector: Projector | Choices | None = None, *, outcome: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        used = 0
        if projector is not None:
            metrics.TOKENS.labels(self.surface, "in").inc(projector.prompt_tokens)
            metrics.TOKENS.labels(self.surface, "out").inc(projector.completion_tokens)
            # The engine's count when it finished; else (cancelled, failed) the prompt and an
            # estimate of the text the client got.
            used = projector.prompt_tokens + (projector.completion_tokens if projector.done
                                              else limits.estimate_tokens(projector.text))
            if outcome is None:
                outcome = "failed" if projector.error else ("length" if projector.finish_reason == "length" else "completed")
        self.reservation.settle(used)
        metrics.OUTCOMES.labels(self.surface, outcome or "failed").inc()

    def release(self) -> None:
        """The engine never took the request (refused, timed out, client gone while waiting):
        its reservation is returned. No-op after end()."""
        if not self.ended:
            self.reservation.settle(0)

    def observe(self, event: dict) -> None:
        kind = event.get("kind")
        if kind == "accepted":
            self.accepted()
            if event.get("reused"):
                metrics.PREFIX_REUSE.labels(self.surface).inc(event["reused"])
        elif kind == "done":
            hit = (event.get("stats") or {}).get("hit_pct")
            if isinstance(hit, (int, float)) and not isinstance(hit, bool) and 0 <= hit <= 100:
                metrics.EXPERT_HIT.labels(self.surface).observe(hit)
        elif kind == "text" and event.get("text"):
            self.text()
