"""Model clients over real HTTP against a loopback OpenAI-compatible server; the scripted kind."""

from __future__ import annotations

import json

import pytest

from actors.models.registry import ModelError, OpenAIModel, ScriptedModel, load_models
from engine.models import Message, Price, ToolSpec, cost_micros
from tests.conftest import LiveServer
from tests.openai_stub import OpenAIStub, completion


@pytest.fixture(scope="module")
def stub():
    s = OpenAIStub()
    live = LiveServer(s.app)
    s.url = live.url + "/v1"
    yield s
    live.stop()


def _model(stub, **kw):
    return OpenAIModel("local", base_url=stub.url, model="qwen3-8b", api_key="k", **kw)


TOOL = ToolSpec(name="confide", description="say how the work goes", parameters={"type": "object"})


@pytest.mark.anyio
async def test_openai_kind_sends_tools_and_reads_tool_calls_and_usage(stub):
    stub.answer(completion("hi", tool_calls=[("confide", {"text": "I am stuck"})], usage=(120, 30)))
    model = _model(stub, price=Price(input_micros_per_mtok=150_000, output_micros_per_mtok=600_000))

    try:
        out = await model.complete([Message(role="user", content="hello")], [TOOL])
    finally:
        await model.close()
    sent = stub.requests[-1]
    assert sent["model"] == "qwen3-8b" and sent["messages"] == [
        {"role": "user", "content": "hello"}
    ]
    assert sent["tools"][0]["function"]["name"] == "confide"
    assert out.text == "hi" and out.tool_calls[0].name == "confide"
    assert json.loads(out.tool_calls[0].arguments) == {"text": "I am stuck"}
    assert cost_micros(out.usage, model.price) == 36  # 120*0.15 + 30*0.6 = 36 micro-USD


@pytest.mark.anyio
async def test_missing_usage_is_unknown_not_free(stub):
    stub.answer(completion("x", usage=None))
    model = _model(stub)
    out = await model.complete([Message(role="user", content="x")])
    assert out.usage is None and cost_micros(out.usage, model.price) is None


@pytest.mark.anyio
async def test_retries_then_errors_cleanly(stub):
    stub.answer(503, completion("after retry"))
    assert (await _model(stub).complete([Message(role="user", content="x")])).text == "after retry"
    stub.answer(400)
    with pytest.raises(ModelError):
        await _model(stub).complete([Message(role="user", content="x")])
    stub.answer(OpenAIStub.GARBAGE)
    with pytest.raises(ModelError) as info:
        await _model(stub).complete([Message(role="user", content="x")])
    assert info.value.code == "model_garbage"


@pytest.mark.anyio
async def test_a_hanging_model_times_out(stub):
    stub.answer(OpenAIStub.HANG)
    with pytest.raises(ModelError) as info:
        await _model(stub).complete([Message(role="user", content="x")], timeout=0.3)
    assert info.value.code == "model_timeout"


@pytest.mark.anyio
async def test_scripted_kind_is_deterministic(tmp_path):
    script = tmp_path / "s.toml"
    script.write_text(
        'default = "Fine."\n'
        "[[rules]]\n"
        'match = "moved"\n'
        'text = "Noted."\n'
        'tool_calls = [{name = "confide", arguments = {text = "They moved"}}]\n'
        "[[rules]]\n"
        'match = "broken"\n'
        'tool_calls = [{name = "confide", arguments = "{not json"}]\n'
    )
    models = load_models({"demo": {"kind": "scripted", "script": "s.toml"}}, base_dir=tmp_path)
    model = models["demo"]
    assert isinstance(model, ScriptedModel)
    out = await model.complete([Message(role="user", content="I moved to Oslo")])
    assert out.text == "Noted." and json.loads(out.tool_calls[0].arguments) == {
        "text": "They moved"
    }
    broken = await model.complete([Message(role="user", content="broken")])
    assert broken.tool_calls[0].arguments == "{not json"
    assert (await model.complete([Message(role="user", content="other")])).text == "Fine."


def test_bad_model_config_is_a_clear_error(tmp_path):
    from engine.errors import InvalidInput

    for spec in (
        {"kind": "nope"},
        {"kind": "openai", "model": "x"},
        {"kind": "scripted", "script": "missing.toml"},
    ):
        with pytest.raises(InvalidInput):
            load_models({"m": spec}, base_dir=tmp_path)


@pytest.mark.anyio
async def test_scripted_rules_per_bot_come_before_the_shared_ones(tmp_path):
    from actors.models.registry import ScriptedModel
    from engine.models import Message

    script = tmp_path / "s.toml"
    script.write_text(
        'default = "shared default"\n'
        '[[rules]]\nmatch = "hello"\ntext = "shared hello"\n'
        '[[bots.Ada.rules]]\nmatch = "hello"\ntext = "Ada says hello"\n'
        '[bots.Bo]\ndefault = "Bo default"\n'
    )
    model = ScriptedModel.from_file("s", script)

    async def ask(name: str, text: str) -> str | None:
        messages = [
            Message(role="system", content=f"You are {name}.\nBe brief."),
            Message(role="user", content=text),
        ]
        return (await model.complete(messages)).text

    assert await ask("Ada", "hello there") == "Ada says hello"
    assert await ask("Bo", "hello there") == "shared hello"
    assert await ask("Bo", "nothing") == "Bo default"
    assert await ask("Cy", "nothing") == "shared default"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[bots.Ada.rules]]\nmatch = "("\n')
    import pytest

    from engine.errors import InvalidInput

    with pytest.raises(InvalidInput):
        ScriptedModel.from_file("bad", bad)
