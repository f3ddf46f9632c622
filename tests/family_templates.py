"""Chat templates that render tools, calls and results as each family's published templates
do (cut down to that part): Qwen 2.5's Hermes tags, Llama 3.1's JSON with "parameters",
Mistral's [TOOL_CALLS] list (its call ids nine alphanumerics, or the template raises),
Granite 3's <|tool_call|> list, Llama 3.2's pythonic calls; and a tiny checkpoint with one."""

from __future__ import annotations

import shutil
from pathlib import Path

QWEN = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}

# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}{% if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}{{ '<|im_start|>assistant' }}{% if message.content %}{{ '\n' + message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}{% set tool_call = tool_call.function %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}{{ '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}{{ '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

LLAMA3 = """{{- bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython<|eot_id|>{% endif %}
{%- for message in messages %}{% if message.role == 'user' and tools and loop.first %}
{{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' }}
{%- for t in tools %}{{ t | tojson(indent=4) }}{{ '\n\n' }}{% endfor %}{{ message.content + '<|eot_id|>' }}
{%- elif message.role == 'assistant' and message.tool_calls %}{% if message.tool_calls | length != 1 %}{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + tool_call.name + '", "parameters": ' + (tool_call.arguments | tojson) + '}<|eot_id|>' }}
{%- elif message.role == 'tool' %}{{ '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- else %}{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

MISTRAL = """{{- bos_token }}{%- for message in messages %}{% if message.role == 'user' %}
{%- if tools and loop.last %}{{ '[AVAILABLE_TOOLS] [' }}{% for t in tools %}{{ t | tojson }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ '][/AVAILABLE_TOOLS]' }}{% endif %}
{{- '[INST] ' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' and message.tool_calls %}{{ '[TOOL_CALLS] [' }}
{%- for call in message.tool_calls %}{% if call.id is not defined or call.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
{{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + ', "id": "' + call.id + '"}' }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ ']' + eos_token }}
{%- elif message.role == 'tool' %}{% if message.tool_call_id is not defined or message.tool_call_id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
{{- '[TOOL_RESULTS] {"content": ' + (message.content | tojson) + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- elif message.role == 'assistant' %}{{ ' ' + message.content + eos_token }}
{%- endif %}{% endfor %}"""

GRANITE = """{%- if tools %}{{ '<|start_of_role|>available_tools<|end_of_role|>\n' }}{% for t in tools %}{{ t | tojson(indent=4) }}{{ '\n\n' }}{% endfor %}{{ '<|end_of_text|>\n' }}{% endif %}
{%- for message in messages %}{% if message.role == 'assistant' and message.tool_calls %}
{{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>[' }}{% for call in message.tool_calls %}{{ '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}' }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ ']<|end_of_text|>\n' }}
{%- elif message.role == 'tool' %}{{ '<|start_of_role|>tool_response<|end_of_role|>' + message.content + '<|end_of_text|>\n' }}
{%- else %}{{ '<|start_of_role|>' + message.role + '<|end_of_role|>' + message.content + '<|end_of_text|>\n' }}
{%- endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{% endif %}"""

PYTHONIC = """{{- bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>

You are an expert in composing functions. If you decide to invoke any of the function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]
Here is a list of functions in JSON format that you can invoke.
[{% for t in tools %}{{ t | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}]<|eot_id|>{% endif %}
{%- for message in messages %}{% if message.role == 'assistant' and message.tool_calls %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n[' }}{% for call in message.tool_calls %}{{ call.function.name + '(' }}
{%- for k, v in call.function.arguments.items() %}{{ k + '=' }}{{ v | tojson }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}
{{- ')' }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ ']<|eot_id|>' }}
{%- elif message.role == 'tool' %}{{ '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- else %}{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

TEMPLATES = {"hermes": QWEN, "llama3_json": LLAMA3, "mistral": MISTRAL, "granite": GRANITE, "pythonic": PYTHONIC}
# The markers each family's tokenizer has as special tokens (Qwen's <tool_call> is text).
SPECIAL = {"mistral": ["[TOOL_CALLS]"], "granite": ["<|tool_call|>"]}


def family_checkpoint(tiny_model_dir: Path, folder: Path, family: str) -> Path:
    """The tiny model with ``family``'s chat template (and its markers as special tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TEMPLATES[family]
    if family in SPECIAL:
        tokenizer.add_tokens(SPECIAL[family], special_tokens=True)
        model = AutoModelForCausalLM.from_pretrained(folder)
        model.resize_token_embeddings(len(tokenizer))
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
