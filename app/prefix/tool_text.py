"""Tools written into the prompt's text rather than `tools`: entries listed in a system prompt
(markdown, tags, code, CLI help), JSON tool schemas in a message, and whether two requests hold
them in another order (a `tool_order` break wherever the tools sit)."""

from __future__ import annotations

import ast
import functools
import itertools
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from app.prefix.sketch import Region, RequestSketch
from app.prefix.strings import shared_ends

# a tool entry in system text, as public prompts list them: `- name(args): ...`, `1. name - ...`,
# `* name -> ...` (`nox --list`), `name -- ...` (GDB's `help user-defined`; round 77),
# `` `name`: ...``, `<function>{...}</function>` (Anthropic's legacy tool prompt; a case test has
# it), `{"name": ...}`, `## name`, a declaration in code, lower-case keywords before the name
# and its parameters (`def name(`, `async function name(`, `pub fn name(`), an HTTP route
# (`GET /lessons/{id} - ...`; a request line to a variable or a full URL, `GET {{host}}/x`, round 28), and a name in columns: its arguments, then a tab or a gap of two
# spaces or more before the description (a CLI's `--help`, `bin/rails -T`, a tab-separated table, its cells padded
# before the tab, Helm's `helm plugin list`; round 78)
# what stands before a declared name in code: lower-case keywords (`def`, `pub fn`), Java's
# modifiers and capitalised type, C#'s access modifier, modifiers and type
_KEYWORDS = r"(?:[a-z]+\s+){1,3}"
_JAVA_TYPE = r"(?:(?:public|private|protected|static|final|abstract)\s+)*[A-Z][\w<>\[\],.? ]*\s"
_CSHARP_TYPE = r"(?:public|private|protected|internal)\s+(?:(?:static|async|virtual|override|sealed)\s+)*[A-Za-z_][\w<>\[\],.?]*\s+"
TOOL_LINE = re.compile(
    r"""^\s*(?:<function\b|\{\s*"(?:name|type)"|#+\s*`?[A-Za-z_][\w.\-]*`?\s*$|"""
    rf"""{_KEYWORDS}[A-Za-z_][\w.]*\s*\(|(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)\s+(?:/|\{{\{{|https?://)|"""
    r"""\(\d{1,3}\)\s*`?[A-Za-z_][\w.\-]*`?[,:(]|"""
    rf"""{_JAVA_TYPE}[a-z_]\w*\s*\(|{_CSHARP_TYPE}[A-Za-z_]\w*\s*\(|"""
    r"""[A-Za-z_][\w.\-/:]*(?: [^ \t]+)*(?: *\t| {2,})\S|"""
    r"""(?:[-*•+]|\d+[.)])?\s*`?[A-Za-z_][\w.\-]*`?\s*(?:\(|:|\s[-—–]\s|\s(?:->|→|=>|--)\s))""")
# a line that opens with a name set apart by its markup, whatever the tag or the markdown: a tag
# with a name or id attribute (`<tool name="x">`, `<command id="x"/>`), a tag holding only a name
# (`<tool_name>x</tool_name>`), a bold, code or table-cell name (`**x**`, `` `x` ``, `| x |`, a table drawn in
# box-drawing characters too, `│ x │`: PDM's `pdm run --list`; round 49). Outside
# an attribute or code the name must read as an identifier (lower-case first, or with `_ . : /`
# inside): `- **Tone**: friendly` is a rule with a bold heading, not a tool.
_NAME = r"[A-Za-z_][\w\-]*(?:[.:/][A-Za-z_][\w\-]*)*"
# a command named by a sign glued to it, whatever the sign (`/status`, a bot's `!cmd`, `@name`):
# punctuation that is not a bullet, a quote, a bracket or other markup handled above
_SIGIL = r"""[^\w\s"'`(\[{<|*#>•+\-.,:;]"""
_IDENT = r"(?:[a-z_][\w\-]*(?:[.:/][A-Za-z_][\w\-]*)*|[A-Za-z][A-Za-z\d]*(?:[_.:/][A-Za-z\d][\w\-]*)+)"
NAMED_LINE = re.compile(
    rf"""^\s*(?:[-*•+>]|\d+[.)])?\s*(?:<[\w:\-]+\s[^>]*?\b(?:name|id)\s*=\s*["']?{_NAME}"""
    rf"""|<([\w:\-]+)>\s*(?:`{_NAME}`|{_IDENT})\s*</\1>\s*$|\*\*(?:`{_NAME}`|{_IDENT})\*\*|`\.?{_NAME}`"""
    rf"""|[|│┃]\s*(?:`{_NAME}`|{_IDENT})\s*[|│┃]"""
    rf"""|{_SIGIL}{_IDENT}(?=[\s(:]|$))""")
# a tool's name on a line of its own after a name key (CrewAI's `Tool Name: x`, LlamaIndex's
# `> Tool Name: x`, ADK's `Agent name: x`, `name: x`, a Lisp keyword's `:name "x"`: gptel's
# `gptel-make-tool`, a Clojure map's `:function {:name "x"`, a PHP array's `'name' => 'x',`), the
# first line of a block that describes the tool; a record that opens with its name key in a list
# written with leading commas (Dhall's, Elm's, Haskell's style: `, { name = "x"`; round 35)
TOOL_NAME_LINE = re.compile(rf"""(?i)^\s*(?:>\s*)?(?:[,\[]\s*)?(?:\{{\s*)?(?:(?:[a-z]+[ _]?)?name\s*[:=]\s*["'`]?{_NAME}["'`]?|"""
                            rf"""(?::[a-z]+\s*\{{\s*)?:name\s+"{_NAME}"|["']name["']\s*=>\s*["']{_NAME}["'])\s*,?\s*$""")
# a name written as code (snake_case, dotted, camelCase): `- rom_report: ...` names a tool, `- Tone: ...` does not
_CODE_NAME = re.compile(r"^\s*(?:[-*•+]|\d+[.)])?\s*`?(?:[a-z][a-z0-9]*(?:[_.][A-Za-z0-9]+)+|[a-z]+[A-Z]\w*)`?\s*[(:]")
_ENUMERATOR = re.compile(r"^\s*(?:\(\d{1,3}\)|\d{1,3}[.)])\s*")  # `1. `, `2) `, `(3) `
# a declaration in code: keywords, a Java or a C# type before a name and `(`
_DECLARATION = re.compile(rf"^\s*(?:{_KEYWORDS}|{_JAVA_TYPE}|{_CSHARP_TYPE})[A-Za-z_]\w*\s*\(")
# a type declared in code (`class WeinSuchen < RubyLLM::Tool`, `struct StartSessionTool: Tool {`,
# Go's `type SiloStand struct{`)
_TYPE_DECLARATION = re.compile(r"^\s*(?:(?:public|private|internal|open|final|abstract|export|sealed|global|with|without"
                               r"|inherited|sharing|virtual|static|data|case)\s+)*"
                               r"(?:class|struct|interface|record|object|protocol|enum|module)\s+[A-Z]\w*"
                               r"|^\s*type\s+[A-Z]\w*\s+(?:struct|interface)\b"  # Go: `type SiloStand struct{`
                               r"|^\s*impl(?:<[^>]*>)?\s+[\w:]+\s+for\s+[A-Z]\w*")  # Rust: `impl Tool for Rufbereitschaft {`
# a call whose first argument is the tool's quoted name (Prism's `Tool::as('x')`, `FunctionSchema("x", …)`,
# a constructor's: `new McpSchema.Tool("x", …)`)
_CALL_NAMED = re.compile(rf"""^\s*(?:[A-Za-z_]\w*\s*=\s*)?(?:\.|new\s+)?(?:[\w\\]+(?:::|->|\.))*\w+\(\s*(?:name\s*=\s*)?["']{_NAME}["']\s*[,)]""")
# (an assignment may take the call: MATLAB's `f = openAIFunction("salt_stock", …)`, round 26)
# a brace list that opens with the tool's quoted name (Wolfram's `LLMTool[{"gate_status", "…"}, …]`, round 26), or
# a tuple that does (Hare getopt's subcommands, `("helfereinsatz", [`; round 76)
_LISTED_NAME = re.compile(rf"""^\s*[{{(]\s*"{_NAME}"\s*,""")
# a name alone on its line in a call's arguments (ellmer's `tool(\n  wave_forecast,`, a quoted `"kurs_buchen",`);
# indented alone, a command's name as a help lists it (Django's `manage.py help`, `npm run`'s `  db:seed`);
# a name with a separator alone on a line (a skill's `<name>` tag on lines of its own: `schneeprofil-auswerten`)
_LONE_NAME = re.compile(r"""^\s*(?:["'][A-Za-z_][\w.-]*(?:/[A-Za-z_][\w.-]*)?["']|[a-z][a-z0-9]*(?:_[a-z0-9]+)+),\s*$"""
                        r"""|^\s+[a-z][a-z0-9]*(?:[_:-][a-z0-9]+)*\s*$|^[a-z][a-z0-9]*(?:[_-][a-z0-9]+)+$""")
# a name given by an annotation in a comment (a REST Client or JetBrains HTTP Client request's `# @name x`,
# JSDoc's `// @name x`): the block below it is the named entry (round 28)
_ANNOTATED_NAME = re.compile(rf"^\s*(?:#+|//+|/?\*+|--|;+)\s*@name\s+{_NAME}\s*$")
# a heading that names a resource or an action by its route or method in brackets (API Blueprint's
# `## lot_history [/tools/lot_history]`, `### Call lot_history [POST]`; round 29)
_ROUTE_HEADING = re.compile(r"^#{1,6}\s+\S[^\[\n]{0,80}\s\[(?:/[^\]\s]*|(?:GET|POST|PUT|PATCH|DELETE)(?:\s+/[^\]\s]*)?)\]\s*$")
# a command declared by keywords and its quoted name, then its parameters in brackets (a Nushell
# module's `export def "tool launch_log" [`; round 32)
_QUOTED_DECLARATION = re.compile(rf'^\s*{_KEYWORDS}"[^"\n]{{1,60}}"\s*\[')
# a block opened by a keyword and a quoted name, its properties after it (a KDL node, `tool "race_results"
# description="…" {`, or with no children and no braces; an HCL block's `tool "x" {`), and a definition
# named after `#` that opens a struct, empty too (CUE's `#race_results: {`, `#milk_tank: {}`; round 33)
_NAMED_BLOCK = re.compile(rf'^\s*[a-z][\w-]*\s+"{_NAME}"(?:(?:\s+[\w-]+=(?:"[^"\n]*"|[^\s{{]+))+\s*(?:\{{\s*\}}?)?'
                          rf'|\s*\{{\s*\}}?)\s*$|^\s*#{_NAME}!?\s*:\s*\{{\s*\}}?\s*$')
_NAME_ASSIGNED = re.compile(rf"""(?i)^\s*(?:(?:let|var|const|val|static)\s+)*name\s*(?::\s*[^=\n]{{1,30}})?[:=]\s*["']{_NAME}["']""")
# a banner that opens a tool's block (OpenHands' `---- BEGIN FUNCTION #3: name ----`)
_BANNER_NAME = re.compile(rf"(?i)^[-=#* ]*(?:BEGIN\s+)?(?:FUNCTION|TOOL|COMMAND|ACTION)\b[^:\n]{{0,12}}:\s*{_NAME}\s*[-=#* ]*$")
_POSITION_NUMBER = re.compile(r"(?<=#)\d{1,3}\b")  # a block's number by its position: it stays, the block moves
_NUMBER_SIGN = re.compile(r"#\d")  # where `_POSITION_NUMBER` can match (a literal search: C speed, no look-behind)
# a name written as code in a config or a heading: snake or kebab case (`run_go_tests`, `film-order`),
# or camel case (`pendingOrders`); a config's plain word (`server`) is none
_SNAKE_OR_KEBAB = r"[a-z][a-z0-9]*(?:[_-][a-z0-9]+)+"
_AS_CODE = rf"(?:{_SNAKE_OR_KEBAB}|[a-z]+[A-Z]\w*)"
# a block that a name written as code opens, its properties inside (a HOCON or nginx-style config's
# `  run_go_tests {`; a config's `server {` section is no tool; round 36)
_CODE_NAMED_BLOCK = re.compile(rf"^\s*{_AS_CODE}\s*[:=]?\s*\{{\s*$")
# a config file's section header that names its entry: a kind and the name (configparser's
# `[tool:film_order]`, a TOML table's `[tools.film_order]`, git config's `[tool "film_order"]`) or a
# name written as code alone (`[film_order]`); a config's `[server]` names no tool (round 37)
_SECTION_NAMED = re.compile(r'^\s*\[\[?(?:[A-Za-z_][\w-]*(?::|\.|\s+")[A-Za-z_][\w.-]*"?'
                            rf'|{_SNAKE_OR_KEBAB})\]\]?\s*$')
# a heading that holds only a name written as code (an Org file's `* wachs_vorrat`, its property drawer
# and text below it; round 39)
_CODE_HEADING = re.compile(rf"^(?:\*+|#+)\s+{_AS_CODE}\s*$")
# a markup directive that declares what it names, written as code (reStructuredText's
# `.. py:function:: lane_availability(day)`, `.. option:: --dry-run`; round 40)
# (`.. image:: logo.png` names a file, not a tool)
_DIRECTIVE_NAMED = re.compile(r"^\s*\.\.\s+(?:[a-z]+:[a-z][\w-]*::\s+[A-Za-z_][\w.]*(?:\(|\s*$)"
                              r"|[a-z][\w-]*::\s+(?:--?[\w-]+\s*$|[A-Za-z_][\w.]*\())")
# a command allowed to run, named by its executable's path in a `bin` directory, after whom it runs
# as and its tags (`sudo -l`'s `(root) NOPASSWD: /usr/bin/systemctl restart web`; round 41); a list
# of other paths (files, folders) names no command
_COMMAND_PATH_LINE = re.compile(r"^\s*(?:\([\w.-]+(?::[\w.-]+)?\)\s*)?(?:[A-Z_]+:\s*)*(?:/[\w.@+-]+)*/s?bin/[\w.@+-]+(?:\s|$)")
# a logic program's fact or term whose first argument is the tool's name, bare (a Prolog file's
# `tool(pressing_job,` with its arguments on the lines below, `tool(saegen_pfand, [], []).`), and
# a structured comment that declares a predicate by its name and modes (PlDoc's `%! name(+A:string)
# is det.`; round 41)
_TERM_NAMED = re.compile(rf"^\s*[a-z]\w*\(\s*(?:{_AS_CODE}|[a-z]\w*)\s*,(?:\s*$|.*\)\.\s*$)")
_DOC_DECLARED = re.compile(r"^\s*%!\s+[a-z]\w*(?:\(|\s+is\s+\w+)")
# a device's command as its help lists it: capitals joined by a command sign, an argument or a
# query after it, two spaces or more, then what it does (a modem's `AT+BAND=<Hz>    set the band`,
# an instrument's `MEAS:VOLT:DC?    read the voltage`; round 42); a time zone's `UTC+1` is none
_DEVICE_COMMAND_LINE = re.compile(r"^\s*[A-Z]{2,}[A-Z0-9]*(?:[+:*#&][A-Z][A-Z0-9]*)+(?:=<[^<>\n]+>|\?)?\s{2,}\S")
# a value declared with its type in an ML-family interface (an OCaml `.mli`'s `val trip_departures :`,
# its arrows below; round 43)
_VAL_DECLARED = re.compile(r"^\s*(?:val|external)\s+[a-z_][\w']*\s*:(?!=)")
# a usage line of a program's help: its name, a subcommand, then arguments in usage syntax (docopt's
# `  ringlog nets close [<net>...] [--reason=<text>]`, `<arg>`, `[--opt]`, `(a | b)`; round 43)
_USAGE_LINE = re.compile(r"^\s+[a-z][\w.-]*(?:\s+[a-z][\w-]*){1,2}(?:\s+(?:<[^<>\n]+>|\[[^\[\]\n]+\]|\([^()\n]+\)|--?[\w-]+"
                         r"(?:=<[^<>\n]+>)?)(?:\.\.\.)?)+\s*$")
# a keyword-driven step that calls a tool by its name written as code, the cells apart by two spaces
# or more (Robot Framework's `${result}=    Call Tool    trail_zustand    tag=${tag}`; round 43)
# (the step keeps its result: a table's `Name    first_name` row calls nothing)
_STEP_CALLS_NAME = re.compile(rf"^\s*\$\{{\w+\}}=?\s{{2,}}[A-Z]\w*(?: [A-Za-z]\w*)*\s{{2,}}{_AS_CODE}(?:\s{{2,}}|\s*$)")
# a command macro as `doskey /macros` prints it: a short lower-case name, `=`, a command with its
# arguments (`mig=dotnet ef migrations add $1 --project src`; round 39)
_MACRO_LINE = re.compile(r"^[a-z][\w.-]{0,23}=[\w.\\/-]+\s+\S")
# a cron table's line: five schedule fields or an `@` nickname, then the command it runs (`crontab -l`,
# the scheduled jobs an agent may run; round 34)
_CRON_LINE = re.compile(r"^\s*(?:(?:[\d*][\d*/,\-]*\s+){5}|@(?:reboot|yearly|annually|monthly|weekly|daily|midnight|hourly)\s+)[/~\w$.]")
# a shell's command alias (`alias name='command'` in an aliases file, fish's `abbr -a name command`,
# `doskey name=command`; round 35) or git's as `git config --get-regexp '^alias\.'` prints them
# (`alias.name command`; round 36): the commands a team runs, one a line
_ALIAS_LINE = re.compile(r"^\s*(?:(?:alias|abbr|doskey)\s+(?:-{1,2}[a-z]+\s+)*|alias\.)[\w.:@+\-]+(?:=|\s+\S)")
# a shell's completion spec for a command (fish's `complete -c fdesk -n __fish_use_subcommand -a hire-booking -d
# '…'`, bash's `complete -F _fdesk fdesk`; round 53): a CLI's subcommands and options, one a line
_COMPLETION_LINE = re.compile(r"^\s*complete\s+-{1,2}[A-Za-z][\w-]*\s+\S")
# a chat bot's command as its help prints it: the bot's name, the command's words, its arguments in
# usage syntax, then ` - ` and what it does (Hubot's `hubot echo <text> - Reply back with <text>`; round 57);
# a glossary's `returns - Within 30 days` has no arguments
_BOT_HELP_LINE = re.compile(r"^[a-z][\w.-]*(?: [a-z][\w-]*){1,3}(?: (?:<[^<>\n]+>|\[[^\[\]\n]+\]))+ - [A-Z]")
# a target of a CMake-generated Makefile as its `help` lists it: three dots, the target's name, a note
# in brackets on the default one (`... regatta_report`, `... all (the default if no target is provided)`;
# round 68)
_MAKE_TARGET_LINE = re.compile(r"^\.\.\. [A-Za-z_][\w.+/-]*(?: \([^()\n]+\))?\s*$")
# a target as `bazel query … --output=label_kind` lists it: its rule's class, `rule`, then its label
# (`py_binary rule //tools:publish_results`, `sh_binary rule @ops//tools:sync`; round 69)
_LABEL_KIND_LINE = re.compile(r"^[a-z][\w]* rule (?:@[\w.-]*)?//[\w./-]*:[\w.+/-]+\s*$")
ENTRY_LINES = 4  # lines of a tool's block besides the one naming it (arguments, description, returns)
_SHAPE = re.compile(r"\s*(?:</?[\w:\-]+|[^\w\s]*)")
# JSON tool schemas written into a message's text (`schema_tools`): an object opening with a key,
# with a name and one of these parameter-schema keys (OpenAI, Anthropic, MCP)
_OBJECT_START = re.compile(r'\{\s*"')
SCHEMA_KEYS = frozenset({"parameters", "input_schema", "inputSchema"})
SCHEMA_SCAN_CHARS = 512 * 1024


def tools_span(sketch: RequestSketch) -> tuple[int, int] | None:
    """Where the rendered tool definitions lie (templates render them with tojson)."""
    found = [(p, p + len(raw)) for p, raw in ((sketch.text.find(raw), raw) for raw in sketch.tools_raw) if p >= 0]
    if not found:
        return None
    return min(p for p, _ in found), max(e for _, e in found)


# ---------------------------------------------------------------------- tools in two requests

def tool_change(prev: RequestSketch, cur: RequestSketch) -> tuple[bool, bool, str]:
    """(reordered, set changed, detail) for the tools of two requests. Reordered: the tools both
    send come in another relative order, or one of them with its keys in another order."""
    pc, cc = prev.tools_canon, cur.tools_canon
    common = Counter(pc) & Counter(cc)
    set_changed = Counter(pc) != Counter(cc)

    def kept(canon: list[str], raw: list[str]) -> list[tuple[str, str]]:
        left = Counter(common)
        out = []
        for c, r in zip(canon, raw, strict=True):
            if left[c] > 0:
                left[c] -= 1
                out.append((c, r))
        return out

    kp, kc = kept(pc, prev.tools_raw), kept(cc, cur.tools_raw)
    if [c for c, _ in kp] != [c for c, _ in kc]:
        return True, set_changed, "same tools, different order"
    if [r for _, r in kp] != [r for _, r in kc]:
        return True, set_changed, "same tools, different key order"
    return False, set_changed, "tools added, removed or edited"


def lines_permuted(prev_text: str, cur_text: str,
                   lines: tuple[list[str], list[str]] | None = None) -> tuple[bool, bool]:
    """(permuted, tool-like): the lines that differ between two system prompts are the same lines
    in another order; tool-like when they read as tool entries (`- name(args): ...`, <tool ...>).
    `lines`: the two texts' `splitlines()`, when the caller has them (read, never changed)."""
    p, c = lines if lines is not None else (prev_text.splitlines(), cur_text.splitlines())
    i, s = shared_ends(p, c)
    pw, cw = p[i:len(p) - s], c[i:len(c) - s]
    if len(pw) < 2 or pw == cw or len(pw) != len(cw):  # each reading below moves lines: as many on both sides
        return False, False
    # as many characters, then the sets: two documents differ there at C speed, before any sort
    if sum(map(len, pw)) == sum(map(len, cw)) and set(pw) == set(cw) and sorted(pw) == sorted(cw):
        return True, tool_entries(cw) or tool_blocks(pw, cw) or templated_blocks(pw, cw) or in_code_block(c, i, len(c) - s)
    # entries numbered by position (`1. name …`, `(1) name …`): the numbers stay, the entries move
    if sum(map(bool, map(_ENUMERATOR.match, cw))) >= 2:  # first: a match per line at C level, no copies
        pu, cu = [_ENUMERATOR.sub("", ln, count=1) for ln in pw], [_ENUMERATOR.sub("", ln, count=1) for ln in cw]
        if pu != cu and sorted(pu) == sorted(cu):
            return True, tool_entries(cw)
    # blocks numbered by position inside their banner (`BEGIN FUNCTION #3: name`): the numbers stay.
    # Without such a number anywhere the blocks read as above (`pn`, `cn` would be `pw`, `cw`).
    if _NUMBER_SIGN.search(prev_text) or _NUMBER_SIGN.search(cur_text):
        pn, cn = [_POSITION_NUMBER.sub("#", ln) for ln in pw], [_POSITION_NUMBER.sub("#", ln) for ln in cw]
        if pn != cn and sorted(pn) == sorted(cn) and any(_BANNER_NAME.match(ln) for ln in cn):
            return True, tool_blocks(pn, cn)
    return False, False


_FENCE = re.compile(r"^\s*(?:```|~~~)")
_JSON_KEYED = re.compile(r'^\s*"[^"\n]*"\s*:')  # a JSON member with its key (Julia's `"--stelle"` alone is code)
_JSON_CODE_ID = re.compile(rf'^\s*"(?:id|name|key|slug|type)"\s*:\s*"{_AS_CODE}"\s*,?\s*$')
_DATA_FENCE = re.compile(r"(?i)^\s*(?:```|~~~)\s*(?:json5?|jsonc|ya?ml|toml|xml|csv|ini)\s*$")


def in_code_block(lines: list[str], start: int, end: int) -> bool:
    """Are `lines[start:end]` inside one fenced code block (a fence opened before them and not closed,
    closed after them) of a program or a listing? Its lines moved are its entries moved: what a
    client renders per tool into a code block, whatever the notation (round 77); rules are prose
    outside code blocks. Data (a block marked JSON, YAML, TOML …) is read by what it holds, and JSON's
    items are tools when named as code (an agent card's skill, `"id": "send_sms"`): a manifest's products
    moved, named in words, are no tools."""
    fences = [k for k, ln in enumerate(lines) if _FENCE.match(ln)]
    before = [k for k in fences if k < start]
    if len(before) % 2 == 0 or not any(k >= end for k in fences) or any(start <= k < end for k in fences):
        return False
    moved = lines[start:end]
    if any(_JSON_KEYED.match(ln) for ln in moved):  # JSON's items: tools when named as code (`"id": "send_sms"`)
        return any(_JSON_CODE_ID.match(ln) for ln in moved)
    return not _DATA_FENCE.match(lines[before[-1]])


# what a listing puts before each entry: a logger's clock, a tree's branch (`[07:41:09] ├── clean   Removes …`,
# gulp's `--tasks`; round 66), or a package manager's mark of one character in brackets, installed or not
# (xbps-query's `[*] name-1.2.0_1  …`, `[-] …`; round 83), or a table's first column holding that mark, before
# the first bar (zypper search's `i+ | name | summary | package`; round 87)
_LINE_LEAD = re.compile(r"^(?:\[\d{1,2}:\d\d(?::\d\d)?\]\s+)?(?:[│┃|]\s+)*"
                        r"(?:[├└┣┗][─━]{2}|[|`]--|\[[*+x! -]\](?= )|[a-z!.]{1,2}\+?(?= +[|│┃] ))\s*")


# a line's reading (does it name a tool?) is kept per distinct line: a tenant's system text repeats on every
# request and a pool's tool lists in every tenant, and reading one line is some 30 patterns tried
LINE_MEMO_ENTRIES = 8192
LINE_MEMO_CHARS = 512  # a longer line is read every time (~4 MB held at most)


def _per_line(read: Callable[[str], bool]) -> Callable[[str], bool]:
    """`read`, kept for the last LINE_MEMO_ENTRIES distinct lines up to LINE_MEMO_CHARS long."""
    kept = functools.lru_cache(maxsize=LINE_MEMO_ENTRIES)(read)
    return functools.wraps(read)(lambda line: kept(line) if len(line) <= LINE_MEMO_CHARS else read(line))


# a package as a package manager lists it, its name and version one word, then what it does (xbps-query's
# `sumfest-backstage-0.3.1_2 issue a …`, where the longest is set apart by one space; round 83)
_PACKAGE_LINE = re.compile(r"^[a-z][a-z0-9+.]*(?:-[a-z][a-z0-9+.]*)*-\d+(?:\.\d+)+(?:_\d+)?\s+[^\W\d_]")


@_per_line
def _names_tool(line: str) -> bool:
    """Does a line (its listing's lead taken off) name its tool on a line of its own, in one of the
    shapes `tool_entries` counts?"""
    return bool(TOOL_LINE.match(line) or NAMED_LINE.match(line) or TOOL_NAME_LINE.match(line) or _CRON_LINE.match(line)
                or _ALIAS_LINE.match(line) or _COMPLETION_LINE.match(line) or _MACRO_LINE.match(line)
                or _COMMAND_PATH_LINE.match(line) or _DEVICE_COMMAND_LINE.match(line) or _USAGE_LINE.match(line)
                or _BOT_HELP_LINE.match(line) or _MAKE_TARGET_LINE.match(line) or _LABEL_KIND_LINE.match(line)
                or _PACKAGE_LINE.match(line))


def tool_entries(lines: list[str]) -> bool:
    """Do these reordered lines of a system text read as a list of tool entries? Each entry names
    its tool on a line of its own (`TOOL_LINE`, `NAMED_LINE`): at least half of the lines do, or,
    for entries of several lines (a tag block, a heading and its text), at least two do, all in
    one shape (same indentation and opening markup), and no other shape occurs more often than
    once per entry (plus one for a block cut at the window's edge). Prose rules reordered name
    nothing and stay a `template_change`."""
    named: list[str] = []
    rest: list[str] = []
    lines = [_LINE_LEAD.sub("", ln, count=1) for ln in lines]
    for ln in lines:
        (named if _names_tool(ln) else rest).append(ln)
    if len(named) * 2 >= len(lines):
        return True
    if len(named) < 2 or len({_shape(ln) for ln in named}) != 1:
        return False
    # blocks whose every entry is named as a tool is (markup, a name key, a name written as code)
    # may hold a few lines of one shape each (arguments, description); others one at most
    strong = all(NAMED_LINE.match(ln) or TOOL_NAME_LINE.match(ln) or _CODE_NAME.match(ln) or _DECLARATION.match(ln)
                 for ln in named)
    per_entry = ENTRY_LINES if strong else 1
    return max(Counter(map(_shape, rest)).values(), default=0) <= per_entry * len(named) + 1


def tool_blocks(prev: list[str], cur: list[str]) -> bool:
    """Did lines that declare names move, in two texts that hold the same lines? What each tool's
    block declares (its name in a tag, `class X < RubyLLM::Tool`, `struct XTool: Tool {` with its
    `let name = "x"`) moves with the block, whatever separates the blocks. Rules moved as
    paragraphs declare nothing and stay a `template_change`. Lines the two texts share at their
    start and end declare the same names in both, so callers pass only the lines between them."""
    declaring = {ln for ln in {*prev, *cur} if declares_name(ln)}  # each distinct line read once
    dp, dc = [ln for ln in prev if ln in declaring], [ln for ln in cur if ln in declaring]
    return dp != dc and sorted(dp) == sorted(dc)


# a name written as code: snake_case, kebab-case of two parts or more, camelCase
_CODE_IDENT = re.compile(rf"(?<![\w.-])(?:{_SNAKE_OR_KEBAB}|[a-z]+(?:[A-Z][a-z0-9]+)+)(?![\w-])")


_JSON_MEMBER = re.compile(r'^\s*"')  # JSON's members: named objects are read as JSON (`schema_tools`)
_FILE_NAMED = re.compile(r"\0\.[A-Za-z]\w{0,5}\b")


# a name of one word in double quotes after a bracket or an `=`, as code passes it, when a line holds no name written
# as code (`("helfereinsatz", [`, `tools["refund"] = {`; round 76); a rule's quoted word (`writes "refund":`) is prose's
_QUOTED_WORD = re.compile(r'(?:(?<=[\[({]")|(?<== "))[a-z][a-z0-9]{2,30}(?=")')


def _opener(line: str) -> tuple[str, str] | None:
    """(the line with its name masked, the name) when a line holds one name written as code, once
    or more, or else one word in double quotes as code passes it: the line a client's loop renders
    from one template per tool."""
    names = set(_CODE_IDENT.findall(line)) or set(_QUOTED_WORD.findall(line))
    if len(names) != 1 or _JSON_MEMBER.match(line):
        return None
    (name,) = names
    template = line.replace(name, "\0")
    if template.count("\0") == 1 and _FILE_NAMED.search(template):
        return None  # a file named, not a tool (`.. image:: shop-logo.png`): a tool's file names it twice
    return template, name


def templated_blocks(prev: list[str], cur: list[str]) -> bool:
    """Did blocks of several lines move, each opened by a line made from one template but for a
    name written as code, every name its own (`# .gemini/commands/order-show.toml  (/order-show)`,
    `### order_show`): what a client renders per tool with one loop, whatever the notation (round
    48)? Rules moved as paragraphs are not rendered from one template around a code name, and
    one-line entries (calls in steps) are not blocks."""
    openers = [(k, o) for k, ln in enumerate(cur) if (o := _opener(ln)) is not None]
    before = [o for ln in prev if (o := _opener(ln)) is not None]
    for template in {t for _, (t, _) in openers}:
        rows = [(k, n) for k, (t, n) in openers if t == template]
        names = [n for _, n in rows]
        earlier = [n for t, n in before if t == template]
        if len(rows) >= 2 and len(set(names)) == len(names) and sorted(earlier) == sorted(names) \
                and earlier != names and all(b - a >= 2 for (a, _), (b, _) in itertools.pairwise(rows)):
            return True
    return False


# a function declared by its keyword and name, then its body's brace (PowerShell's `function
# Invoke-OrderShow {`, a shell's `function order_show {` or `order_show() {`; round 45), and the body's arguments
# between bars (Elvish's `fn helfereinsatz {|@argv|`; round 76)
_BRACE_FUNCTION = re.compile(r"^\s*(?:function\s+[A-Za-z_][\w-]*(?:\s*\(\s*\))?|fn\s+[A-Za-z_][\w-]*|[a-z_][\w-]*\s*\(\s*\))"
                             r"\s*\{(?:\|[^|\n]*\|)?\s*$")
# a Tcl procedure, in its namespace or not, its arguments in braces (`proc desk::sonderbusse {argv} {`; round 66)
_TCL_PROC = re.compile(r"^\s*proc\s+(?:[\w-]+::)*[A-Za-z_][\w-]*\s+\{[^{}\n]*\}\s*\{\s*$")
# a Scheme or Racket function defined with its arguments (`(define (standplatz-suchen argv)`; round 67), not a
# value defined inside it (`(define current-stand (make-parameter #f))`)
_SCHEME_DEFINE = re.compile(r"^\s*\(define\s+\([A-Za-z_][\w*!?<>=/+-]*[\s)]")


# a member of a TypeScript type whose type is a function (Cloudflare Code Mode's `declare const
# codemode: { name: (input: {...}) => Promise<unknown>; }`): a tool declared by its name
# a WebAssembly component's WIT `name: func(…)`, its name in kebab case, too (round 30)
_FUNCTION_MEMBER = re.compile(r"^\s*(?:readonly\s+)?[A-Za-z_$][\w$]*(?:-[A-Za-z0-9]+)*\??\s*:\s*(?:func\s*)?"
                              r"\(\s*(?:[A-Za-z_$][\w$-]*\??\s*:|\))")


# a function defined in one line by assignment (Julia's `api_logs(; lines=nothing) = SiteAPI.api_logs(; lines)`,
# the form PromptingTools.jl's tools take; round 25)
_SHORT_DEFINITION = re.compile(r"^[a-z_][\w!]*\([^()\n]*(?:\([^()\n]*\)[^()\n]*)*\)\s*=\s*\S")


# a manual page's title line names its command (troff's `.TH ORDER-SHOW 1 2026-03-02 …`; round 51)
_MAN_TITLE = re.compile(r"^\.TH\s+\"?[A-Za-z_][\w.\\-]*\"?\s+\"?\d")


# a comment that opens a tool's block with the path of its file, a file per tool (Gemini CLI's
# `# .gemini/commands/order-status.toml  (/order-status)`; round 48): a path in a folder, with an extension
_FILE_HEADING = re.compile(r"^\s*(?:#+|//+|--|;+)\s*\.?[\w@-]+(?:/[\w.@-]+)*/[\w.@-]+\.[A-Za-z]\w{0,5}(?:\s|$)")


# a function defined by a Lisp's `defn` or `defun` and its name (Janet's and Clojure's `(defn lost-property`,
# Common Lisp's `(defun lost-property (args)`; round 71), as Scheme's `(define (name …)` declares one; or a value
# defined by `def`, a Clojure tool's option specs (`(def passen-startliste`; round 77)
_LISP_DEFN = re.compile(r"^\s*\((?:defn-?|defun|defmacro|def)\s+[A-Za-z_][\w*!?<>=/+.-]*(?:\s|$)")
# a package as `pipx list` lists it, the apps it exposes on the lines under it (`   package carnival-radio-log
# 2.3.0, installed using Python 3.12.3`; round 70)
_PIPX_PACKAGE = re.compile(r"^\s*package [\w.-]+ \S+, installed using \S+ \d[\w.+-]*\s*$")


@_per_line
def declares_name(line: str) -> bool:
    """Does a line name a tool as code or markup does (a tag holding the name, a name key, a
    declaration of a function or a type, `let name = "x"`, a call given the name first)?"""
    return bool(NAMED_LINE.match(line) or TOOL_NAME_LINE.match(line) or _DECLARATION.match(line)
                or _TYPE_DECLARATION.match(line) or _NAME_ASSIGNED.match(line) or _CALL_NAMED.match(line)
                or _LONE_NAME.match(line) or _BANNER_NAME.match(line) or _FUNCTION_MEMBER.match(line)
                or _SHORT_DEFINITION.match(line) or _LISTED_NAME.match(line) or _ANNOTATED_NAME.match(line)
                or _ROUTE_HEADING.match(line) or _QUOTED_DECLARATION.match(line) or _NAMED_BLOCK.match(line)
                or _CODE_NAMED_BLOCK.match(line) or _SECTION_NAMED.match(line) or _CODE_HEADING.match(line)
                or _DIRECTIVE_NAMED.match(line) or _TERM_NAMED.match(line) or _DOC_DECLARED.match(line)
                or _VAL_DECLARED.match(line) or _STEP_CALLS_NAME.match(line) or _BRACE_FUNCTION.match(line)
                or _FILE_HEADING.match(line) or _MAN_TITLE.match(line) or _JSON_NAMED_ITEM.match(line)
                or _TCL_PROC.match(line) or _SCHEME_DEFINE.match(line) or _PIPX_PACKAGE.match(line)
                or _LISP_DEFN.match(line))


# an item of a JSON list named as code by its `name` member on a line of its own (a Postman collection's
# requests, `"name": "book_in_device",`; round 55): what moves with the item
_JSON_NAMED_ITEM = re.compile(rf'^\s*"name"\s*:\s*"{_AS_CODE}"\s*,?\s*$')


def _shape(line: str) -> str:
    """A line's indentation and opening markup (`  <id`, `* **`, `###`): what entries share."""
    m = _SHAPE.match(line)
    return m.group(0) if m else ""


def schema_tools(text: str, start: int = 0, end: int | None = None,
                 python_literals: bool = False) -> list[tuple[str, str, int, int]]:
    """The JSON tool schemas written into `text[start:end]` (a client that serialises its tools into
    the system prompt or a message rather than `tools`), in order, each as (canonical JSON, JSON as
    written, where the object it is in starts and ends): an object with a `name` and a parameter schema, OpenAI's `{"type": "function",
    "function": {...}}` wrapper and a `{"tools": [...]}` list included. One decode per object
    start that is not inside a decoded object; nothing past SCHEMA_SCAN_CHARS. `python_literals`:
    without JSON ones, schemas printed as a Python literal (`_python_tools`; the diagnosis of a
    break reads them, not every request's digest)."""
    end = min(len(text) if end is None else end, start + SCHEMA_SCAN_CHARS)
    out: list[tuple[str, str, int, int]] = []
    decoder = json.JSONDecoder()
    pos = start
    while (m := _OBJECT_START.search(text, pos, end)) is not None:
        try:
            obj, stop = decoder.raw_decode(text, m.start())
        except ValueError:
            pos = m.start() + 1
            continue
        if stop > end:
            break
        items = _tool_list(obj)
        listed = items is not None  # under a key that lists tools: a named object is one (schema.org's actions)
        items = items if items is not None else [obj]
        raw = text[m.start():stop]
        for item in items:
            fn = next((item[k] for k in _TOOL_WRAPPERS if isinstance(item, dict) and isinstance(item.get(k), dict)),
                      item)  # OpenAI's wrapper, Bedrock Converse's `toolSpec`, Ultravox's `temporaryTool`
            if isinstance(fn, dict) and isinstance(fn.get("name", fn.get("modelToolName")), str) and (
                    _declares_parameters(fn) or listed):  # under a key that lists tools, a name is an entry
                written = raw if len(items) == 1 else json.dumps(item, ensure_ascii=False)
                out.append((json.dumps(item, sort_keys=True, ensure_ascii=False), written, m.start(), stop))
        pos = stop
    return out or (_python_tools(text, start, end) if python_literals else [])


_PYTHON_LITERAL_START = re.compile(r"\{\s*'")  # a dict's first key; a list before it is taken in


def _python_tools(text: str, start: int, end: int) -> list[tuple[str, str, int, int]]:
    """Tool schemas written as a Python literal that ends its line (ToolLLaMA's `APIs: [{'name':
    ...}, ...]`: a list of dicts printed with `repr`), as `schema_tools` gives them; parsed by
    `ast.literal_eval` (C), at most one literal per line."""
    out: list[tuple[str, str, int, int]] = []
    pos = start
    while (m := _PYTHON_LITERAL_START.search(text, pos, end)) is not None:
        first = m.start() - 1 if m.start() > start and text[m.start() - 1] == "[" else m.start()
        line_end = text.find("\n", first, end)
        line_end = end if line_end < 0 else line_end
        stop = max(text.rfind("]", first, line_end), text.rfind("}", first, line_end)) + 1
        pos = line_end + 1
        if stop <= first:
            continue
        try:
            obj = ast.literal_eval(text[first:stop])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        for item in obj if isinstance(obj, list) else (_tool_list(obj) or [obj]):
            if isinstance(item, dict) and isinstance(item.get("name"), str) and _declares_parameters(item):
                out.append((json.dumps(item, sort_keys=True, ensure_ascii=False, default=str),
                            json.dumps(item, ensure_ascii=False, default=str), first, stop))
    return out


_TOOL_WRAPPERS = ("function", "toolSpec", "temporaryTool")
CHAT_COMMAND_TYPES = (1, 2, 3)  # Discord's application command types: a slash command, a user's, a message's


def _declares_parameters(fn: dict[str, Any]) -> bool:
    """Does a named object declare a tool's parameters: a schema under a key tools use
    (`SCHEMA_KEYS`; Ultravox's `dynamicParameters`) or an object's schema under any key, two levels
    down at most (`_holds_schema`), or OpenRPC's `params`, content descriptors each with a name and
    a schema, or a chat app's command options, each named with a numeric type, or no options and a
    command type with a description (Discord's application commands as a bot registers them)?"""
    if SCHEMA_KEYS & fn.keys() or isinstance(fn.get("dynamicParameters"), list) or _holds_schema(fn, 2):
        return True
    params = fn.get("params")
    if isinstance(params, list) and (bool(params) or "result" in fn) and all(
            isinstance(p, dict) and isinstance(p.get("name"), str) and "schema" in p for p in params):
        return True
    options = fn.get("options")  # a chat app's command options, each named and typed (Discord's; round 47)
    if isinstance(options, list) and options and all(
            isinstance(o, dict) and isinstance(o.get("name"), str) and isinstance(o.get("type"), int) for o in options):
        return True
    # a chat command without options: its numeric command type (Discord's 1, 2, 3) and its description
    return options is None and fn.get("type") in CHAT_COMMAND_TYPES and isinstance(fn.get("description"), str) \
        and not isinstance(fn.get("type"), bool)


def _holds_schema(obj: dict[str, Any], depth: int) -> bool:
    """Does an object hold a JSON Schema of an object's properties (`{"type": "object",
    "properties": {...}}`) under its keys, `depth` levels down at most (ElevenLabs' webhook tool:
    `api_schema.request_body_schema`)? A config's members are values, not schemas."""
    for value in obj.values():
        if isinstance(value, dict):
            if value.get("type") == "object" and isinstance(value.get("properties"), dict):
                return True
            if depth > 1 and _holds_schema(value, depth - 1):
                return True
    return False


def _tool_list(obj: Any) -> list[Any] | None:
    """The tools a decoded object lists: `{"tools": [...]}` (an MCPB manifest's too), MCP's
    `tools/list` result (`{"result": {"tools": [...]}}`), Gemini's `function_declarations`, an
    OpenRPC document's `methods`, or under any key a list whose every item is named and declares
    parameters (a LobeChat plugin manifest's `api`); None when it lists none (it may be one tool
    itself)."""
    for holder in (obj, obj.get("result") if isinstance(obj, dict) else None):
        if isinstance(holder, dict):
            for key in ("tools", "function_declarations", "functionDeclarations", "methods", "functions",
                        "potentialAction", "commands"):  # schema.org's actions of a JSON-LD thing (round 27)
                if isinstance(holder.get(key), list):
                    return holder[key]
            for value in holder.values():  # under another key: a list of named objects that declare parameters
                if isinstance(value, list) and value and all(
                        isinstance(t, dict) and isinstance(t.get("name"), str) and _declares_parameters(t) for t in value):
                    return value
    return None


def region_schemas_reordered(prev: RequestSketch, cur: RequestSketch, pd: int, region: Region) -> bool:
    """Do the messages where the prompts diverge (same role) carry the same JSON tool schemas in
    another order, or one of them with its keys in another order? (A reorder keeps the message's
    length: other messages are not scanned.)"""
    other = prev.region_at(pd)
    if other is None or other.role != region.role or other.end - other.start != region.end - region.start:
        return False
    ps = schema_tools(prev.text, other.start, other.end, python_literals=True)
    cs = schema_tools(cur.text, region.start, region.end, python_literals=True)
    return schemas_reordered([(c, w) for c, w, _, _ in ps], [(c, w) for c, w, _, _ in cs])


def schemas_reordered(prev: Sequence[Sequence[str]], cur: Sequence[Sequence[str]]) -> bool:
    """Two lists of JSON tool schemas as (canonical, as written) pairs, texts or keys of them: the
    same schemas (at least two) in another order, or one of them with its keys in another order."""
    return len(cur) >= 2 and sorted(c for c, _ in prev) == sorted(c for c, _ in cur) and \
        [tuple(x) for x in prev] != [tuple(x) for x in cur]
