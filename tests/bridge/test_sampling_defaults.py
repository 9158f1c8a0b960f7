"""A request that names no temperature / top_p gets the served model's recommendation (the
GGUF's general.sampling.* keys, announced in MODEL's `sampling`), else the product's defaults;
a value the client names always wins. The bridge resolves it, so every surface agrees."""
from engine_bridge import sampling
from engine_bridge.worker import parse_job

RECOMMENDS = {"name": "smol", "sampling": {"temperature": 0.2, "top_p": 0.9}}


def test_it_takes_the_models_recommendation_when_the_client_names_none():
    job = parse_job({"prompt": "hi", "max_tokens": 4, "temperature": None, "top_p": None}, RECOMMENDS)
    assert (job.temperature, job.top_p) == (0.2, 0.9)


def test_it_keeps_what_the_client_named():
    job = parse_job({"prompt": "hi", "max_tokens": 4, "temperature": 0.0, "top_p": 1.0}, RECOMMENDS)
    assert (job.temperature, job.top_p) == (0.0, 1.0)
    job = parse_job({"prompt": "hi", "max_tokens": 4, "temperature": 1.3, "top_p": None}, RECOMMENDS)
    assert (job.temperature, job.top_p) == (1.3, 0.9)


def test_it_falls_back_to_the_products_defaults():
    for model in (None, {"name": "x"}, {"sampling": None}, {"sampling": {"temperature": float("nan")}},
                  {"sampling": {"top_p": 0}}, {"sampling": "warm"}):
        assert sampling.model_defaults(model) == (sampling.DEFAULT_TEMPERATURE, sampling.DEFAULT_TOP_P), model
    assert sampling.model_defaults({"sampling": {"top_p": 0.95}}) == (sampling.DEFAULT_TEMPERATURE, 0.95)


def test_it_refuses_extension_flags_that_are_not_booleans():
    for field in ("routes", "heat", "topk"):
        try:
            parse_job({"prompt": "hi", "max_tokens": 4, field: "yes"})
        except ValueError as exc:
            assert field in str(exc)
        else:
            raise AssertionError(f"{field}='yes' was accepted")


def test_a_job_that_is_no_object_is_a_type_error_naming_the_job():
    for raw in (["hi"], "hi", 3):
        try:
            parse_job(raw)
        except TypeError as exc:
            assert "job must be an object" in str(exc)
        else:
            raise AssertionError(f"job={raw!r} was accepted")
