"""The one owner of sampling defaults and of the rules a sampling value must meet to reach the engine.

Every surface (chat websocket, /v1 APIs, titles) validates its client's values here, then sends
what `sampling_validate` returns. The invariant: a value it returns is finite, in the engine's
range, and survives the wire's decimal form (protocol.format_number) unchanged, so the engine never
refuses a SUBMIT header for a number (a header refusal is a stream-level `ERROR 0`, which costs
every conversation its stream).

Why quantise: the wire carries plain decimals and the engine parses them with strtod; a value such
as 1e-320 is in range for Python but a subnormal that the engine's parser treats as a range error.
Values are rounded to WIRE_DECIMALS places. A temperature below the last place is greedy (0); a
top_p below it keeps only the most likely token either way, so it becomes the smallest step.
"""
import math

DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 1.0
TEMPERATURE_RANGE = (0.0, 2.0)   # inclusive
TOP_P_RANGE = (0.0, 1.0)         # (low exclusive, high inclusive]
SEED_LIMIT = 1 << 63             # signed 64-bit positive: what JSON clients and our engine agree on
WIRE_DECIMALS = 6
WIRE_STEP = 10.0 ** -WIRE_DECIMALS


class SamplingError(ValueError):
    """A client value the engine cannot take; `field` is the name the client used."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _finite_number(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(field, f"{field} must be a number")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise SamplingError(field, f"{field} must be a finite number") from None
    if not math.isfinite(number):
        raise SamplingError(field, f"{field} must be a finite number")
    return number


def wire_temperature(value: object, field: str = "temperature") -> float:
    number = _finite_number(value, field)
    low, high = TEMPERATURE_RANGE
    if not low <= number <= high:
        raise SamplingError(field, f"{field} must be in [{low:g}, {high:g}]")
    return round(number, WIRE_DECIMALS)


def wire_top_p(value: object, field: str = "top_p") -> float:
    number = _finite_number(value, field)
    low, high = TOP_P_RANGE
    if not low < number <= high:
        raise SamplingError(field, f"{field} must be in ({low:g}, {high:g}]")
    return max(round(number, WIRE_DECIMALS), WIRE_STEP)


def wire_seed(value: object, field: str = "seed") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise SamplingError(field, f"{field} must be an integer in [0, 2^63)")
    return value


def model_defaults(model_info: dict | None) -> tuple[float, float]:
    """(temperature, top_p) a request gets when it names neither: the served model's own
    recommendation (its GGUF's general.sampling.* keys, announced in the MODEL line's `sampling`)
    where it has one, else the product's. A recommendation the wire cannot carry is ignored."""
    recommended = (model_info or {}).get("sampling") or {}
    temperature, top_p = DEFAULT_TEMPERATURE, DEFAULT_TOP_P
    try:
        if recommended.get("temperature") is not None:
            temperature = wire_temperature(recommended["temperature"])
        if recommended.get("top_p") is not None:
            top_p = wire_top_p(recommended["top_p"])
    except (SamplingError, AttributeError):
        return DEFAULT_TEMPERATURE, DEFAULT_TOP_P
    return temperature, top_p


def sampling_validate(*, temperature: object = None, top_p: object = None, seed: object = None,
                      names: dict[str, str] | None = None,
                      defaults: tuple[float, float] | None = None) -> tuple[float, float, int | None]:
    """-> (temperature, top_p, seed) ready for the wire; None takes the default: `defaults`
    (model_defaults of the served model) or the product's.
    `names` maps a parameter to the client's own field name for the error text."""
    names = names or {}
    default_temperature, default_top_p = defaults or (DEFAULT_TEMPERATURE, DEFAULT_TOP_P)
    return (
        default_temperature if temperature is None else wire_temperature(temperature, names.get("temperature", "temperature")),
        default_top_p if top_p is None else wire_top_p(top_p, names.get("top_p", "top_p")),
        wire_seed(seed, names.get("seed", "seed")),
    )
