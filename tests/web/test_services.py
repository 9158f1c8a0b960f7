"""Prompt rendering and the chat service functions (DB, no engine)."""
import pytest

from chat import services
from chat.models import Message
from engine_bridge import toolsyntax
from engine_bridge.prompting import CHATML_TEMPLATE, TemplateError, render_prompt
from engine_bridge.served import served_model_get

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch, settings):
    monkeypatch.setattr("engine_bridge.served._read_state", lambda: {})
    settings.CHAT_AUTO_TITLE = False


def served_render(messages):
    """The default model's prompt: its template as engine_bridge.served picks it."""
    return toolsyntax.render(messages, (), served_model_get())


def test_it_renders_chatml_by_default():
    prompt = served_render([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_it_uses_the_models_template_and_tokens(monkeypatch):
    tpl = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    monkeypatch.setattr("engine_bridge.served._read_state", lambda: {"model": {"chat_template": tpl, "bos_token": "<s>", "eos_token": "</s>"}})
    assert served_render([{"role": "user", "content": "hi"}]) == "<s>[user]hi</s>[assistant]"


def test_it_falls_back_to_the_settings_template(settings):
    settings.CHAT_TEMPLATE = "{% for m in messages %}{{ m.content }}|{% endfor %}"
    assert served_render([{"role": "user", "content": "a"}]) == "a|"


def test_it_exposes_raise_exception():
    tpl = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    with pytest.raises(TemplateError, match="first must be user"):
        render_prompt([{"role": "assistant", "content": "x"}], template=tpl)


def test_it_sandboxes_templates():
    with pytest.raises(TemplateError):
        render_prompt([], template="{{ ''.__class__.__mro__[1].__subclasses__() }}")


def test_it_renders_history_byte_identically_between_turns(alice):
    turn = services.turn_send(alice, None, "Hello  there\n")
    emitted = " Hi! \n\n"  # leading/trailing whitespace must survive as emitted
    services.message_finish(turn.assistant.pk, text=emitted, status=Message.Status.COMPLETE, stats={})
    turn2 = services.turn_send(alice, turn.conversation.pk, "again")
    assert turn2.prompt.startswith(turn.prompt + emitted)


def test_it_stores_the_user_message_before_generation(alice):
    turn = services.turn_send(alice, None, "What is up")
    msgs = list(turn.conversation.messages.all())
    assert [(m.role, m.status) for m in msgs] == [("user", "complete"), ("assistant", "streaming")]
    assert turn.conversation.title == "What is up"
    assert turn.created_conversation


def test_it_refuses_a_second_turn_while_streaming(alice):
    turn = services.turn_send(alice, None, "one")
    with pytest.raises(services.ChatError) as exc:
        services.turn_send(alice, turn.conversation.pk, "two")
    assert exc.value.code == "busy"


def test_it_validates_ownership(alice, bob):
    turn = services.turn_send(alice, None, "mine")
    with pytest.raises(services.ChatError) as exc:
        services.turn_send(bob, turn.conversation.pk, "theirs")
    assert exc.value.code == "not_found"


def test_regenerate_replaces_the_last_assistant_message(alice):
    turn = services.turn_send(alice, None, "q")
    services.message_finish(turn.assistant.pk, text="a1", status=Message.Status.COMPLETE, stats={})
    turn2 = services.turn_regenerate(alice, turn.conversation.pk)
    assert turn2.deleted == [turn.assistant.pk]
    assert [m.role for m in turn.conversation.messages.all()] == ["user", "assistant"]
    assert turn2.prompt == turn.prompt


def test_edit_truncates_after_the_edited_message_and_resends(alice):
    turn = services.turn_send(alice, None, "first")
    services.message_finish(turn.assistant.pk, text="a1", status=Message.Status.COMPLETE, stats={})
    t2 = services.turn_send(alice, turn.conversation.pk, "second")
    services.message_finish(t2.assistant.pk, text="a2", status=Message.Status.COMPLETE, stats={})
    first_user = turn.conversation.messages.first()
    t3 = services.turn_edit(alice, turn.conversation.pk, first_user.pk, "FIRST")
    assert [(m.role, m.text) for m in turn.conversation.messages.all()] == [("user", "FIRST"), ("assistant", "")]
    assert "FIRST" in t3.prompt and "second" not in t3.prompt


def test_failed_empty_replies_are_left_out_of_the_prompt(alice):
    turn = services.turn_send(alice, None, "q")
    services.message_finish(turn.assistant.pk, text="", status=Message.Status.ERROR, stats={"error": "x"})
    t2 = services.turn_send(alice, turn.conversation.pk, "q2")
    assert t2.prompt == render_prompt([{"role": "user", "content": "q"}, {"role": "user", "content": "q2"}], template=CHATML_TEMPLATE)


def test_it_enqueues_a_title_after_the_first_exchange(alice, settings, monkeypatch, django_capture_on_commit_callbacks):
    settings.CHAT_AUTO_TITLE = True
    seen = []
    monkeypatch.setattr("chat.tasks.title_conversation.delay", seen.append)
    turn = services.turn_send(alice, None, "q")
    with django_capture_on_commit_callbacks(execute=True):
        services.message_finish(turn.assistant.pk, text="a", status=Message.Status.COMPLETE, stats={})
    assert seen == [turn.conversation.pk]


@pytest.mark.django_db(transaction=True)
def test_the_orphan_sweep_ends_only_replies_whose_process_is_gone(alice):
    """Issue 24: a reply cut off by a crash is `interrupted` with its partial text kept, by the
    sweep (chat.sweeper), not when someone opens the conversation; a live process's are kept."""
    from datetime import timedelta

    from django.utils import timezone

    from chat import sweeper

    dead = services.turn_send(alice, None, "one", owner="dead-process").assistant
    live = services.turn_send(alice, None, "two", owner="live-process").assistant
    legacy = services.turn_send(alice, None, "three").assistant  # no owner: judged by its age
    young = services.turn_send(alice, None, "four", owner="dead-process").assistant
    Message.objects.filter(pk=dead.pk).update(text="partial", updated=timezone.now() - timedelta(seconds=10))
    Message.objects.filter(pk=live.pk).update(updated=timezone.now() - timedelta(seconds=60))
    Message.objects.filter(pk=legacy.pk).update(updated=timezone.now() - services.STALE_STREAMING * 2)
    ended = services.messages_interrupt_orphans(lambda owners: {o: o == "live-process" for o in owners})
    assert sorted(m.pk for m in ended) == sorted([dead.pk, legacy.pk])
    by_pk = {m.pk: m for m in Message.objects.filter(pk__in=[dead.pk, live.pk, legacy.pk, young.pk])}
    assert (by_pk[dead.pk].status, by_pk[dead.pk].text) == ("interrupted", "partial")
    assert by_pk[legacy.pk].status == "error"  # nothing to keep
    assert by_pk[live.pk].status == by_pk[young.pk].status == "streaming"

    def blind(owners):
        raise ConnectionError("Redis is out")

    Message.objects.filter(pk=young.pk).update(updated=timezone.now() - timedelta(seconds=10))
    with pytest.raises(ConnectionError):  # cannot tell: sweeps nothing (sweep_once logs it)
        services.messages_interrupt_orphans(blind)
    assert Message.objects.get(pk=young.pk).status == "streaming"
    assert sweeper.owners_alive(set()) == {}
    assert sweeper.owners_alive({sweeper.relay.PROCESS}) == {sweeper.relay.PROCESS: True}  # never itself


def test_the_sweep_judges_only_the_relays_of_its_own_deployment():
    """Two deployments on one database (the live test stacks, each with its own Redis): one
    swept the other's cut-off reply with no access to its tail log and stored the row's last
    save, short of what the reader had. A relay owner of another deployment is not judged."""
    from chat import sweeper

    mine = sweeper.relay.PROCESS[:8]
    dead_mine, foreign = mine + "0" * 24, ("0" if mine[0] != "0" else "1") * 8 + "0" * 24
    assert len(sweeper.relay.PROCESS) == 32 and sweeper.relay.deployment_tag() == mine
    assert sweeper.owners_alive({dead_mine, foreign}) == {dead_mine: False, foreign: True}
