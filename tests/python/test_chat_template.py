"""stoker's native chat templates (stoker._text.ChatTemplate) against transformers' own rendering
(``render_jinja_template``: jinja2's ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, the AssistantTracker and transformers' tojson): the text and the generation spans
must be equal, on templates written here in the styles of model families (no model's template is
copied) and on the constructs one at a time."""

import json

import pytest

pytest.importorskip("jinja2")
chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")

import stoker  # noqa: E402,F401

try:
    from stoker import _text
except ImportError:
    pytest.skip("this build has no text module", allow_module_level=True)

from stoker.errors import TemplateError  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Templates in the styles of model families.

CHATML_TOOLS = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls | default([]) %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3 = """\
{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- Pull the system message out of the messages #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, respond with a JSON function call.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

INST = """\
{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
    {% set system_message = messages[0]['content'] %}
{% else %}
    {% set loop_messages = messages %}
    {% set system_message = false %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.index0 == 0 and system_message != false %}
        {% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
    {% else %}
        {% set content = message['content'] %}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
    {% elif message['role'] == 'assistant' %}
        {% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}
    {% endif %}
{% endfor %}
"""

GEMMA = """\
{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

DEEPSEEK = """\
{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}\
{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', \
is_first_sp=true) %}\
{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}\
{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}\
{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}\
{%- endif %}{%- endfor %}\
{{ bos_token }}{{ ns.system_prompt }}\
{%- for message in messages %}\
{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}\
{{'<｜User｜>' + message['content']}}{%- endif %}\
{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}\
{%- for tool in message['tool_calls'] %}\
{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + \
tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n' + \
tool['function']['arguments']|tojson + '\\n```<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}\
{%- else %}{{'\\n<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + \
tool['function']['name'] + '\\n```json\\n' + tool['function']['arguments']|tojson + \
'\\n```<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}\
{%- endfor %}{%- endif %}\
{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}\
{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}\
{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}\
{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}\
{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}\
{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}\
{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + \
message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}\
{%- else %}{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}\
{%- endif %}{%- endfor -%}\
{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}\
{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}
"""

PHI = """\
{% for message in messages %}
{% if message['role'] == 'system' and message['content'] %}
{{'<|system|>\n' + message['content'] + '<|end|>\n'}}
{% elif message['role'] == 'user' %}
{{'<|user|>\n' + message['content'] + '<|end|>\n'}}
{% elif message['role'] == 'assistant' %}
{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}{{ '\n' }}
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|assistant|>\n' }}
{% else %}
{{ eos_token }}
{% endif %}
"""

MACROS = """\
{%- macro render_content(content, prefix='') -%}
    {%- if content is string -%}
        {{ prefix }}{{ content }}
    {%- else -%}
        {%- for part in content if part.type == 'text' -%}
            {{ prefix }}{{ part.text }}{{ ' ' if not loop.last }}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro header(role) -%}
<|{{ role | upper }}|>{{ caller() if caller is defined else '' }}
{%- endmacro -%}
{%- for m in messages -%}
{% call header(m.role) %} #{{ loop.index }}/{{ loop.length }}{% endcall %}
{{ render_content(m.content, prefix='> ') }}
{% if loop.previtem is defined %}(after {{ loop.previtem.role }}){% endif %}
{% if loop.nextitem is defined %}(before {{ loop.nextitem.role }}){% endif %}
{{ loop.cycle('odd', 'even') }} {{ loop.revindex }} {{ loop.revindex0 }} {{ loop.first }}
{% endfor -%}
{% if add_generation_prompt %}{{ header('assistant') }}{% endif %}
"""

TOJSON_INDENT = """\
{%- if tools %}
<tools>
{% for tool in tools %}
{{ tool | tojson(indent=4) }}
{{ tool | tojson(indent=2, sort_keys=true) }}
{{ tool.function.parameters | tojson(separators=(',', ':')) }}
{% endfor %}
</tools>
{% endif %}
{% for message in messages %}
[{{ message.role }}] {{ message.content }}
{% if message.tool_calls is defined %}
{{ message.tool_calls | tojson(indent=4) }}
{% endif %}
{% endfor %}
{% if add_generation_prompt %}[assistant]{% endif %}
"""

# A generation block inside a macro and inside a set block: transformers counts its start from the
# top-level output so far (what generate() has yielded), not from where the text lands.
GENERATION_NESTED = """\
{%- macro turn(m) -%}
<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}\
{% else %}{{ m.content }}{% endif %}</{{ m.role }}>
{% endmacro -%}
{%- for m in messages -%}
{{ turn(m) }}
{%- set tail %}{% generation %}[{{ loop.index }}]{% endgeneration %}{% endset -%}
{%- if loop.last %}{{ tail }}{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

FAMILIES = {
    "generation_nested": GENERATION_NESTED,
    "chatml_tools": CHATML_TOOLS,
    "llama3": LLAMA3,
    "inst": INST,
    "gemma": GEMMA,
    "deepseek": DEEPSEEK,
    "phi": PHI,
    "macros": MACROS,
    "tojson_indent": TOJSON_INDENT,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at a place — in °C ☀️",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City, \"quoted\""},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["location"],
        },
    },
}

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hello!"}],
    "system_multi_turn": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?\nExplain."},
        {"role": "assistant", "content": "6, because 3+3=6."},
    ],
    "unicode": [
        {"role": "user", "content": "Bonjour, ça va ? 日本語で答えて 🙂👍🏽"},
        {"role": "assistant", "content": "はい、元気です！🎉 Ελληνικά — «ok»"},
        {"role": "user", "content": "Tabs\tand 'quotes' \"double\" \\ backslash"},
    ],
    "tools": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": {"location": "Paris", "days": 2}}}]},
        {"role": "tool", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 °C in Paris."},
    ],
    "ending_with_assistant": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ],
}

KWARGS = {"bos_token": "<s>", "eos_token": "</s>", "date_string": "29 Nov 2026"}


def transformers_render(template, messages, tools=None, add_generation_prompt=False, **kwargs):
    """transformers' text and generation spans (as code-point ranges), or its exception."""
    rendered, spans = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template,
        return_assistant_tokens_mask=True, add_generation_prompt=add_generation_prompt, **kwargs)
    return rendered[0], [tuple(s) for s in spans[0]]


def stoker_render(template, messages, tools=None, add_generation_prompt=False, **kwargs):
    """stoker's text and spans, the spans converted from bytes to code points."""
    t = _text.ChatTemplate(template, "test")
    context = {"messages": messages, "tools": tools, "documents": None,
               "add_generation_prompt": add_generation_prompt, **kwargs}
    text, spans = t.render(json.dumps(context))
    data = text.encode()

    def chars(b):
        return len(data[:b].decode())
    return text, [(chars(b), chars(e)) for b, e in spans]


def outcome(render, *args, **kwargs):
    try:
        return render(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the type and message are compared
        kind = "template" if type(e).__name__ == "TemplateError" else "other"
        return (kind, str(e) if kind == "template" else "")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_family_matches_transformers(family, conversation, add_generation_prompt):
    template = FAMILIES[family]
    messages = CONVERSATIONS[conversation]
    tools = [WEATHER_TOOL] if conversation == "tools" else None
    want = outcome(transformers_render, template, messages, tools, add_generation_prompt,
                   **KWARGS)
    got = outcome(stoker_render, template, messages, tools, add_generation_prompt, **KWARGS)
    if family == "generation_nested" and not json.dumps(messages, ensure_ascii=False).isascii():
        # A nested block's span does not cover its text (transformers' own placement), so its
        # end, start + the block's length, converts from bytes to code points differently.
        assert (got[0], len(got[1])) == (want[0], len(want[1]))
        return
    assert got == want


def test_families_render_something():
    # Guards the comparison above against both sides failing the same way everywhere.
    for family, template in FAMILIES.items():
        text, _ = stoker_render(template, CONVERSATIONS["ending_with_assistant"], None, True,
                                **KWARGS)
        assert "Hello! How can I help?" in text, family


def test_generation_spans_cover_the_assistant_turns():
    messages = CONVERSATIONS["system_multi_turn"]
    text, spans = stoker_render(CHATML_TOOLS, messages)
    assert [text[b:e] for b, e in spans] == ["4.<|im_end|>", "6, because 3+3=6.<|im_end|>"]
    assert _text.ChatTemplate(CHATML_TOOLS).marks_generation
    assert not _text.ChatTemplate(GEMMA).marks_generation


def test_renders_from_many_threads_at_once():
    # render() releases the GIL; one parsed template serves every thread.
    from concurrent.futures import ThreadPoolExecutor
    template = _text.ChatTemplate(CHATML_TOOLS)
    cases = [(json.dumps({"messages": CONVERSATIONS[name], "tools": None,
                          "add_generation_prompt": k % 2 == 0}), name) for k, name in
             enumerate(sorted(CONVERSATIONS) * 8)]
    want = [template.render(context) for context, _ in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda case: template.render(case[0]), cases))
    assert got == want


def test_strftime_now_is_local_time():
    import datetime
    template = "{{ strftime_now('%Y-%m-%d') }}"
    before = datetime.datetime.now().strftime("%Y-%m-%d")
    got = _text.ChatTemplate(template).render("{}")[0]
    after = datetime.datetime.now().strftime("%Y-%m-%d")
    assert got in (before, after)


# ---------------------------------------------------------------------------------------------
# Constructs one at a time, each rendered by both.

SNIPPETS = [
    # whitespace control, trim_blocks and lstrip_blocks
    "a\n  {% if true %}\n    b\n  {% endif %}\nc\n",
    "a  {% if true %}b{% endif %}  c",
    "a\n  {%+ if true %}b{% endif %}\n",
    "{% if true +%}\nkept{% endif %}",
    "x {{- ' y ' -}} z\n\n",
    "x\n\t {#- comment -#} \n y",
    "  {# comment #}\nafter",
    "a\r\nb\rc\n\n",
    "{% raw %}{{ not evaluated }}{% endraw %}\n{%- raw -%}  x  {%- endraw %} y",
    "  {% raw %}\n{% x %}\n  {% endraw %}\nz",
    "{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n",
    "{% for i in range(3) -%}\n  {{ i }}\n{%- endfor %}",
    "{% for m in users %}\n  {%- if m.active %}\n    A: {{ m.name }}\n  {% elif m.age > 30 -%}\n"
    "    B: {{ m.name }}\n  {%- else %}\n    C: {{ m.name }}\n  {%+ endif %}\n{% endfor %}",
    "{%- if true -%}\n   x\n{%- endif -%}\n   y",
    "{% if true %}   \nx{% endif %}",
    "{#- leading comment #}\n  {#+ kept #}\nbody",
    "{% macro m(x) -%}\n  [{{ x }}]\n{%- endmacro %}\n{{ m(1) }}\n{{ m(2) }}",
    # literals and printing
    "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }} {{ 3.0 }} {{ 1_000 }}",
    "{{ true }} {{ False }} {{ none }} {{ None }} {{ 'it''s' }} {{ \"a\\tb\\n\" }} {{ '\\u00e9\\x41' }}",
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1,), (1, 2), []] }}",
    "{{ {'a': [1, {'b': \"it's\"}], 'c': 'say \"hi\"'} }} {{ ('x',) }} {{ () }}",
    "{{ ['\\n', '\\\\', 'é', '\\x07', '\\u200b', '🙂'] }}",
    "{{ undefined_name }}|{{ undefined_name is defined }}|{{ undefined_name is undefined }}",
    # arithmetic and comparison
    "{{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }}",
    "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2.5 * 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + true }}",
    "{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ undefined_name }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }}",
    "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}",
    "{{ 1 and 'x' }} {{ 0 and 'x' }} {{ '' or 'y' }} {{ not none }} {{ 'a' if false }}|",
    "{{ 'yes' if 1 > 0 else 'no' }} {{ -(3) }} {{ - 2 ** 2 }} {{ 2 ** 3 ** 2 }}",
    "{{ -3 ** 0 }} {{ -3 ** l[0] }} {{ (1 - 4) ** l[0] }} {{ -2.5 ** l[1] }} {{ -l[0] ** 2 }}",
    # access
    "{{ d.a }} {{ d['b'] }} {{ d.missing }}|{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ s[1] }} {{ s[-1] }}",
    "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ s[::-1] }} {{ s[1:3] }} {{ l[-2:] }}",
    "{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }}"
    " {{ d.get('zz', 'dflt') }} {{ d.get('zz') }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %}",
    # string methods
    "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x '.lstrip() }}|{{ ' x  '.rstrip() }}|",
    "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }}"
    " {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a  b '.split(none, 1) }}",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'Hello'.upper() }}"
    " {{ 'HeLLo'.lower() }} {{ 'hello world-x'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ 'aaa'.replace('a', 'b', 2) }} {{ 'héllo'.find('l') }} {{ 'hello'.rfind('l') }}"
    " {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }}"
    " {{ 'ABC'.isupper() }} {{ 'abc'.islower() }} {{ '{} and {}'.format('x', 2) }}",
    "{{ 'préfix'.removeprefix('pré') }} {{ 'é'.upper() }} {{ 'ÉCOLE'.lower() }}",
    "{{ 'straße ﬁx' | upper }} {{ 'İSTANBUL ΟΔΟΣ ΣΑΣ' | lower }} {{ 'ǆemal ßa' | title }}"
    " {{ 'ǆemal ßa'.title() }} {{ 'ßa' | capitalize }} {{ 'Ǆ'.swapcase() }}",
    "{{ {'é': 'ü🙂'} | tojson(true) }} {{ d | tojson(4) }}",
    # filters
    "{{ '  x  ' | trim }}|{{ 'xax' | trim('x') }}|{{ [1, 2] | length }} {{ 'héllo' | count }}",
    "{{ 'hello WORLD' | upper }} {{ 'Hello' | lower }} {{ 'hello world' | title }}"
    " {{ 'hello WORLD' | capitalize }}",
    "{{ 'aXbXc' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 1) }}",
    "{{ undefined_name | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }}"
    " {{ 0 | d('zero') }}",
    "{{ [1, 2, 3] | join(', ') }} {{ ['a'] | join }} {{ users | join(', ', attribute='name') }}",
    "{{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'abc' | list }} {{ d | items | list }}",
    "{{ users | selectattr('active') | map(attribute='name') | list }}"
    " {{ users | rejectattr('active') | map(attribute='name') | join }}",
    "{{ users | selectattr('name', 'equalto', 'bob') | list | length }}"
    " {{ users | map(attribute='age', default=0) | list }}",
    "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }}"
    " {{ [0, 1, ''] | select | list }} {{ ['a', 'b'] | map('upper') | list }}",
    "{{ 5 | string }}{{ 'x' | string }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ '3.7' | int }}"
    " {{ 3.7 | int }} {{ '2.5' | float }} {{ 2 | float }} {{ 'bad' | float }}",
    "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 1.456 | round(2) }}"
    " {{ 1.4 | round(0, 'ceil') }} {{ 1.6 | round(method='floor') }} {{ 3 | round }}",
    "{{ [1, 2, 1, 3] | unique | list }} {{ ['b', 'A', 'a', 'B'] | unique | list }}",
    "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }}"
    " {{ users | sort(attribute='age') | map(attribute='name') | list }}",
    "{{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ {'b': 1, 'a': 2} | dictsort }}"
    " {{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}",
    "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}",
    "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}",
    "{{ ('<a>' | e) | e }} {{ '<a>' | safe | e }} {{ ('<a>' | safe) + '<b>' }}"
    " {{ '<b>' + ('<a>' | safe) }} {{ ('<a>' | e) ~ '<b>' }}",
    "{{ l[::-1] | sort(attribute='v') }} {{ 'Ab c' | sort(attribute='v') }}"
    " {{ 0 | map(attribute='v') | list }} {{ none | select | list }}",
    "{{ l | unique | list }} {{ d | items | list }}",
    "{{ missing | int }}",
    "{{ 3 | indent }}",
    "{{ [1] in d }}",
    "{{ [[1], [1]] | unique | list }}",
    "{{ 'one two  three' | wordcount }} {{ [1, 2, 3, 4, 5] | batch(2) | list }}"
    " {{ [1, 2, 3] | batch(2, 'x') | list }}",
    "{{ [1, 2, 3] | sum }} {{ users | sum(attribute='age') }} {{ [3, 1, 2] | min }}"
    " {{ [3, 1, 2] | max }} {{ ['b', 'A'] | max }} {{ users | max(attribute='age') }}",
    "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}",
    "{{ {'é': '🙂', 'q': 'a\"b\\\\c\\n\\u0001', 'n': none, 'f': 1.0, 't': true} | tojson }}",
    "{{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true, separators=(',', ':')) }}"
    " {{ [1, [2]] | tojson(indent='\\t') }} {{ {'x': 1} | tojson(indent=0) }}",
    "{{ users | first | tojson }} {{ (1, 2) | tojson }}",
    # tests
    "{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }}"
    " {{ true is boolean }} {{ 'x' is string }} {{ d is mapping }} {{ l is sequence }}"
    " {{ l is iterable }} {{ 1 is iterable }} {{ none is none }} {{ d is not none }}",
    "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}"
    " {{ 1 is eq 1 }} {{ 1 is equalto(2) }} {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 1 is lt 2 }}"
    " {{ 1 is le 0 }} {{ 1 is ne 2 }} {{ none is sameas none }} {{ 2 is in [1, 2] }}",
    "{{ true is true }} {{ 0 is false }} {{ false is false }} {{ 'ab' is lower }}"
    " {{ 'AB' is upper }} {{ range is callable }}",
    # loops
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
    "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in l %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}"
    "{% endfor %}",
    "{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.last }}{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %} {% for x in l %}{% else %}no{% endfor %}",
    "{% for i in [1] %}{% break %}{% else %}E{% endfor %} {% for i in [1, 2] %}{% continue %}"
    "{% else %}E{% endfor %} {% for i in [1, 2] %}{% if i == 2 %}{% break %}{% endif %}{% else %}"
    "E{% endfor %}",
    "{% set y = 0 %}{% filter upper %}{% set y = y + 1 %}{{ y }}{% endfilter %}{{ y }}"
    "{% set x %}{% set y = 5 %}{{ y }}{% endset %}{{ x }}{{ y }}"
    "{% generation %}{% set y = 7 %}{% endgeneration %}{{ y }}",
    "{% for x in l %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
    "{% endif %}{{ x }}{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %} {% for x in undefined_name %}"
    "{{ x }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}",
    "{% for i in range(2) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}"
    "{{ loop.index }}|{% endfor %}",
    "{{ range(5) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }}",
    # set and scopes
    "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(n=0, items=[]) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
    "{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.n }} {{ ns.items }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = (1, 2) %}{{ t }}",
    "{% set block %}  inner {{ 1 + 1 }}\n{% endset %}[{{ block }}]",
    "{% set up | upper %}shout{% endset %}{{ up }}",
    "{% filter upper %}quiet {{ 'words' }}{% endfilter %}",
    "{% with x = 1, y = 2 %}{{ x + y }}{% endwith %}{{ x is defined }}",
    "{% set d2 = dict(a=1, b='x') %}{{ d2 }} {{ dict(d2, c=3) }}",
    "{% if x is not defined %}{% set x = 'set' %}{% endif %}{{ x }}",
    "{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}",
    "{% for x in [1, 2] %}{% filter upper %}a{% if x == 2 %}{% continue %}{% endif %}"
    "{% endfilter %}b{% endfor %}",
    "{% for x in [1, 2, 3] %}{% set y %}v{{ x }}{% if x == 2 %}{% continue %}{% endif %}"
    "{% endset %}{{ y }}{% endfor %}",
    "{% set x = 5 %}{% macro show() %}{{ x }}{% endmacro %}{% for x in [1, 2] %}{{ show() }}"
    "{% endfor %}",
    "{% for m in users %}{% set outer = loop %}{% for y in l %}{{ outer.index }}{{ loop.index }} "
    "{% endfor %}{% endfor %}",
    # macros
    "{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }}"
    " {{ m(1, c='y') }} {{ m() }}",
    "{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}body {{ 1 }}{% endcall %}",
    "{% macro row(x) %}<{{ caller(x * 2) }}>{% endmacro %}{% call(v) row(3) %}v={{ v }}{% endcall %}",
    "{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}",
    "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{% call m(1) %}x{% endcall %}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }}{% endfor %}",
    # generators and views, as Python has them
    "{% if l | select('gt', 5) %}a generator is true{% endif %}",
    "{% set g = l | select %}{{ g | first }}|{% for x in g %}{{ x }}{% endfor %}|"
    "{% for x in g %}{{ x }}{% endfor %}|{% set g = l | select %}{{ 2 in g }}|{{ g | list }}",
    "{{ d.items() | first }} {{ range(3) | first }} {{ 1 in range(3) }}",
    "{% set g = l | map('string') %}{{ g | join }}|{{ g | join }}|",
    "{{ d.items() }} {{ d.keys() }} {{ d.values() | list }} {{ d.keys() | length }}",
    "{{ 'a' in d.keys() }} {{ (l | reverse | list) }} {{ d | reverse | list }}",
    "{{ l | select('odd') | length }}",
    "{{ range(3)[1] }} {{ range(3) | length }} {{ range(0) is sequence }}",
    "{{ users | selectattr('active') | first }} {{ users | batch(2) | list | length }}",
    "{{ l | select('odd') | last }}",
]

SNIPPET_CONTEXT = {
    "d": {"a": 1, "b": "two", "c": [1, 2]},
    "l": [1, 2, 3],
    "s": "héllo",
    "users": [{"name": "ann", "age": 31, "active": True},
              {"name": "bob", "age": 25, "active": False},
              {"name": "cy", "age": 40, "active": True}],
}


def jinja_render(template, **context):
    return chat_template_utils._compile_jinja_template(template).render(**context)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_matches_jinja2(index):
    template = SNIPPETS[index]
    native = _text.ChatTemplate(template, "snippet")
    try:
        want = jinja_render(template, **SNIPPET_CONTEXT)
    except Exception:  # noqa: BLE001 - where jinja2 raises, stoker must refuse too
        with pytest.raises(ValueError):
            native.render(json.dumps(SNIPPET_CONTEXT))
        return
    assert native.render(json.dumps(SNIPPET_CONTEXT))[0] == want, template


# ---------------------------------------------------------------------------------------------
# Errors.

def test_refuses_to_print_what_python_prints_as_an_address():
    # jinja2 prints "<generator object ... at 0x...>" or "range(0, 3)": refused, never guessed.
    for template in ["{{ l | map('string') }}", "{{ range(3) }}", "{{ l | reverse }}",
                     "{{ range }}", "{% for x in l %}{{ loop }}{% endfor %}"]:
        with pytest.raises(ValueError, match="cannot print"):
            _text.ChatTemplate(template).render(json.dumps(SNIPPET_CONTEXT))


def test_refuses_what_it_would_compute_differently():
    # A generator read after a lazy filter took it (which items each sees depends on jinja2's
    # evaluation order), and a complex power: errors, where jinja2 renders something.
    for template, message in [
            ("{% set g = l | select %}{% set h = g | map('string') %}{{ h | list }}{{ g | list }}",
             "lazily"),
            ("{{ -3 ** 0.1 }}", "complex")]:
        with pytest.raises(ValueError, match=message):
            _text.ChatTemplate(template).render(json.dumps(SNIPPET_CONTEXT))


def test_raise_exception_message_reaches_python():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    context = json.dumps({"messages": messages, "bos_token": "<s>", "eos_token": "</s>"})
    with pytest.raises(TemplateError) as info:
        _text.ChatTemplate(INST).render(context)
    assert str(info.value) == "Conversation roles must alternate user/assistant/user/assistant/..."
    assert isinstance(info.value, ValueError)


def test_unsupported_filter_is_named_at_parse():
    with pytest.raises(ValueError, match=r"my.jinja:2:\d+: unsupported filter 'pprint'"):
        _text.ChatTemplate("line one\n{{ x | pprint }}", "my.jinja")


def test_unsupported_tag_is_named_at_parse():
    with pytest.raises(ValueError, match=r"t:1:\d+: unsupported tag 'include'"):
        _text.ChatTemplate("{% include 'x.jinja' %}", "t")


def test_syntax_error_names_the_line():
    with pytest.raises(ValueError, match=r"tmpl:3:\d+: "):
        _text.ChatTemplate("a\nb\n{% if x %}{{ 1 + }}{% endif %}", "tmpl")
    with pytest.raises(ValueError, match=r"tmpl:1:\d+: unexpected end of template"):
        _text.ChatTemplate("{% for x in y %}", "tmpl")


def test_runtime_errors_name_the_line():
    with pytest.raises(ValueError, match=r"t:2:\d+: 'missing' is undefined"):
        _text.ChatTemplate("\n{{ missing.attr }}", "t").render("{}")
    with pytest.raises(ValueError, match=r"unsafe"):
        _text.ChatTemplate("{{ l.append(1) }}", "t").render('{"l": []}')
    with pytest.raises(ValueError, match=r"unsupported str method 'zfill'"):
        _text.ChatTemplate("{{ 'x'.zfill(3) }}", "t").render("{}")
    with pytest.raises(ValueError, match=r"not a JSON object"):
        _text.ChatTemplate("x", "t").render("[]")


def test_errors_match_jinja2_where_jinja2_raises():
    for template in ["{{ missing.attr }}", "{{ 1 + 'a' }}", "{{ l.append(1) }}",
                     "{{ none | tojson }}{{ missing | tojson }}"]:
        try:
            jinja_render(template, l=[])
        except Exception:  # noqa: BLE001
            with pytest.raises(ValueError):
                _text.ChatTemplate(template).render('{"l": []}')
        else:
            pytest.fail(f"jinja2 renders {template!r}")
