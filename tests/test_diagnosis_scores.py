"""Diagnosis accuracy on the committed corpora (bench/diagnosis.py scores them the same way and
prints the tables), and the wall between the detector and the held-out split.

The tune side (the first corpus, `tune`, `tune2` and the earlier held-out splits: `heldout` joined
the tune side when `heldout2` was written, `heldout2` when `heldout3` was, `heldout3` when `heldout4`
was, `heldout4` when `heldout5` was, `heldout5` when `heldout6` was, `heldout6` when `heldout7` was,
`heldout7` when `heldout8` was, `heldout8` when `heldout9` was, `heldout9` when `heldout10` was,
`heldout10` when `heldout11` was, `heldout11` when `heldout12` was, `heldout12` when `heldout13` was,
`heldout13` when `heldout14` was, `heldout14` when `heldout15` was, `heldout15` when `heldout16` was,
`heldout16` when `heldout17` was, `heldout17` when `heldout18` was, `heldout18` when `heldout19` was, `heldout19`
when `heldout20` was, `heldout20` when `heldout21` was, `heldout21` when `heldout22` was, `heldout22` when `heldout23`
was, `heldout23` when `heldout24` was, `heldout24` when `heldout25` was, `heldout25` when `heldout26` was, `heldout26` when `heldout27` was, `heldout27` when `heldout28` was, `heldout28` when `heldout29` was, `heldout29` when `heldout30` was, `heldout30` when `heldout31` was, `heldout31` when `heldout32` was, `heldout32` when `heldout33` was, `heldout33` when `heldout34` was, `heldout34` when `heldout35` was, `heldout35` when `heldout36` was, `heldout36` when `heldout37` was, `heldout37` when `heldout38` was, `heldout38` when `heldout39` was, `heldout39` when `heldout40` was, `heldout40` when `heldout41` was, `heldout41` when `heldout42` was, `heldout42` when `heldout43` was, `heldout43` when `heldout44` was, `heldout44` when `heldout45` was, `heldout45` when `heldout46` was, `heldout46` when `heldout47` was, `heldout47` when `heldout48` was, `heldout48` when `heldout49` was, `heldout49` when `heldout50` was, `heldout50` when `heldout51` was, `heldout51` when `heldout52` was, `heldout52` when `heldout53` was, `heldout53` when `heldout54` was, `heldout54` when `heldout55` was, `heldout55` when `heldout56` was, `heldout56` when `heldout57` was, `heldout57` when `heldout58` was, `heldout58` when `heldout59` was, `heldout59` when `heldout60` was, `heldout60` when `heldout61` was, `heldout61` when `heldout62` was, `heldout62` when `heldout63` was, `heldout63` when `heldout64` was, `heldout64` when `heldout65` was, `heldout65` when `heldout66` was, `heldout66` when `heldout67` was, `heldout67` when `heldout68` was, `heldout68` when `heldout69` was, `heldout69` when `heldout70` was, `heldout70` when `heldout71` was, `heldout71` when `heldout72` was, `heldout72` when `heldout73` was, `heldout73` when `heldout74` was, `heldout74` when `heldout75` was, `heldout75` when `heldout76` was, `heldout76` when `heldout77` was, `heldout77` when `heldout78` was, `heldout78` when `heldout79` was, `heldout79` when `heldout80` was, `heldout80` when `heldout81` was, `heldout81` when `heldout82` was, `heldout82` when `heldout83` was, `heldout83` when `heldout84` was, `heldout84` when `heldout85` was, `heldout85` when `heldout86` was, `heldout86` when `heldout87` was, `heldout87` when `heldout88` was, `heldout88` when `heldout89` was) is what the detector is developed against: its scores may rise, never fall below the floors. The held-out split
`heldout89` is measured, not tuned for: its tests assert issue 29's goal (macro-F1 >= 0.97, span exact-match F1 >= 0.92), never the
score it happens to reach, and a further test fails when a value or key that only the held-out pool
uses enters the detector's word lists (docs/diagnosis.md, *How the held-out split is kept apart*)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests/fixtures/diagnosis_v2"))

from material import POOLS  # noqa: E402

from app.prefix import dynamic, value_change, value_kind  # noqa: E402
from app.prefix.fingerprint import Fingerprinter  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402
from bench.diagnosis import CORPORA, HELDOUT, TUNE_SIDE, Scores, score  # noqa: E402

# tune-side corpus -> (accuracy, macro-F1, span exact-match F1), as reached when these floors were set
FLOORS = {
    "old": (1.0, 1.0, 1.0),
    "tune": (1.0, 1.0, 1.0),
    "heldout": (1.0, 1.0, 1.0),  # the first held-out split, tune side since heldout2 exists
    "tune2": (1.0, 1.0, 1.0),
    "heldout2": (1.0, 1.0, 1.0),  # the second held-out split (measured 0.889 / 0.768 / 0.766), tune side since heldout3
    # the third (measured 0.906 / 0.787 / 0.803), tune side since heldout4
    "heldout3": (1.0, 1.0, 1.0),
    "heldout4": (1.0, 1.0, 1.0),  # the fourth (measured 0.831 / 0.738 / 0.573), tune side since heldout5
    "heldout5": (1.0, 1.0, 1.0),  # the fifth (measured 0.896 / 0.764 / 0.667), tune side since heldout6
    # the sixth (measured 0.901 / 0.784 / 0.710), tune side since heldout7: its labels leave `Uhr` out
    # of a date-time (`04.02.2026 um 06:21`), the first splits keep it in (`25.07.2026 22:26 Uhr`)
    "heldout6": (1.000, 1.000, 0.988),
    "heldout7": (1.0, 1.0, 1.0),  # the seventh (measured 0.897 / 0.776 / 0.573), tune side since heldout8
    "heldout8": (1.0, 1.0, 1.0),  # the eighth (measured 0.880 / 0.715 / 0.544), tune side since heldout9
    # the ninth (measured 0.901 / 0.785 / 0.710), tune side since heldout10: 1.0 since round 19
    "heldout9": (1.0, 1.0, 1.0),
    "heldout10": (1.0, 1.0, 1.0),  # the tenth (measured 0.886 / 0.770 / 0.557), tune side since heldout11
    # the eleventh (measured 0.922 / 0.798 / 0.699), tune side since heldout12: 0.998 / 0.9968 / 0.997
    # (the look-alike alarm below)
    "heldout11": (0.998, 0.996, 0.997),
    # the twelfth (measured 0.860 / 0.731 / 0.752), tune side since heldout13: 0.9906 / 0.9662 / 0.9893
    # (Zep's compaction read as a new conversation; a lot day, lane metres and a frame counter each
    # read as an edit the first time they change)
    "heldout12": (0.990, 0.966, 0.989),
    # the thirteenth (measured 0.916 / 0.786 / 0.678), tune side since heldout14: 0.9887 / 0.9798 / 0.8906
    # since round 16 (clocks in words, Java's zone names, a Vite asset's hash in its path, a Tomcat
    # session id's jvmRoute; the look-alike alarm below)
    # round 24 (values found one after another in a key line's value read as one): 0.9887 / 0.9798 / 0.9029
    "heldout13": (0.988, 0.979, 0.902),
    # the fourteenth (measured 0.915 / 0.796 / 0.639), tune side since heldout15: 0.9765 / 0.9621 / 0.8315
    # (a voice agent's expressions as a list of words, number plates, pH, a fuel gauge in eighths, the
    # runway in use, an ATIS letter, Erlang pids and references the first time they change; spans
    # of a GS1 SSCC's `(00)`, OPC UA's `ns=1;g=`, a Kafka `topic-3@offset`)
    # round 25 (one reading with a sign or two decimals on its first change): 0.9781 / 0.9642 / 0.8347
    # round 26 (a possessive key, `Caller's top expressions, …:`; a value in braces is what they hold):
    # 0.9875 / 0.9779 / 0.8533
    # round 28 (a state replaced by another with its reading): 0.9906 / 0.9829 / 0.8700
    # round 65: 0.9953 / 0.9911 / 0.8789 (states with two details or seven words read whole)
    "heldout14": (0.995, 0.991, 0.878),
    # the fifteenth (measured 0.948 / 0.926 / 0.703), tune side since heldout16: 0.9903 / 0.9829 / 0.9626
    # since round 19 (a difficulty's word in a sentence, daytime ticks, a wind reading, a PUE after a key in brackets,
    # each the first time it changes; `12 von 18` read as `12`)
    # round 22 (a wind reading with its direction on its first change): 0.9935 / 0.9883 / 0.9681
    "heldout15": (0.993, 0.988, 0.968),
    # the sixteenth (measured 0.929 / 0.799 / 0.663), tune side since heldout17: 0.9873 / 0.9780 / 0.9235
    # since round 21 (counters after a key the first time they change, callers' numbers in E.164, a Booking.com
    # number, a pair `90 / 30`; distances without their bearing, `45 / 15` read as `45`)
    # round 24 (a key line's value changed again at its key; a distance with its bearing whole): 0.9905 / 0.9830 / 0.9442
    # round 25: 0.9921 / 0.9857 / 0.9468
    "heldout16": (0.992, 0.985, 0.946),
    # the seventeenth (measured 0.951 / 0.930 / 0.752), tune side since heldout18: 0.9796 / 0.9665 / 0.9362
    # since round 19 (counters and a storage bin read as edits the first time they change, an option symbol, a
    # balance's `$`, an antenna's AZ/EL)
    # round 22 (a printer's and an antenna's readings on their first change): 0.9874 / 0.9779 / 0.9606
    # round 24: 0.9921 / 0.9856 / 0.9765
    # round 59: 0.9937 / 0.9883 / 0.9792 (a transponder under a `Zuletzt …` key)
    "heldout17": (0.993, 0.988, 0.979),
    # the eighteenth (measured 0.928 / 0.746 / 0.708), tune side since heldout19: 0.9873 / 0.9761 / 0.9171
    # since round 21
    # (a time in a railway's form, readings below two significant digits, an event id, a week and its
    # day, odds each read as an edit the first time they change; sums whose labels keep the currency
    # sign, which the earlier pools' labels leave out; a tool list with a nameless entry; the look-alike alarm below)
    # round 24: 0.9889 / 0.9787 / 0.9199
    # round 77: 0.9921 / 0.9852 / 0.9199 (tools moved inside a code block, named as code in JSON)
    "heldout18": (0.992, 0.985, 0.919),
    # the nineteenth (measured 0.950 / 0.921 / 0.707), tune side since heldout20: 0.9789 / 0.9547 / 0.8421
    # (a count of vehicles waiting, AIS targets, a ship's MMSI with most digits kept, a pressure pair
    # read as edits the first time they change; llm-functions' and A2A's tool lists; a goose summary
    # longer than the turns it replaced; labels that take in a reading's unit and trend words)
    # round 22 (a pressure pair on its first change): 0.9805 / 0.9569 / 0.8453
    # round 24: 0.9838 / 0.9616 / 0.8667
    # round 44: 0.9838 / 0.9616 / 0.8944
    # round 77: 0.9870 / 0.9680 / 0.8944 (an agent card's skills moved inside a code block)
    "heldout19": (0.987, 0.967, 0.894),
    # the twentieth (measured 0.938 / 0.785 / 0.539), tune side since heldout21: 0.9688 / 0.9227 / 0.6011;
    # since round 22 (a status line's readings on their first change): 0.9782 / 0.9387 / 0.6332
    # (counters, ids and states read as edits the first time they change; Agent Skills' and Flowise's
    # tool lists; front trims and compactions in new shapes; labels that take in a unit or the date
    # after a clock; the look-alike alarm below)
    # round 27 (a summary asked for and kept as the model's reply): 0.9798 / 0.9505 / 0.6332
    # round 44: 0.9798 / 0.9505 / 0.7230; round 55: 0.9813 / 0.9537 / 0.7230 (Flowise tools, JSON items named as
    # code, moved: a tool order)
    # round 77: 0.9860 / 0.9639 / 0.7230 (tools moved inside a code block)
    "heldout20": (0.985, 0.963, 0.722),
    # the twenty-first (measured 0.889 / 0.688 / 0.288), tune side since heldout22: 0.9889 / 0.8515 / 0.5385
    # (a phantom history_edit: a status line's reading added; a compaction that drops one exchange under its summary;
    # a wind's gusts, a departure's clock range, counts of one small integer read as edits the first time they
    # change; labels that take in a value's unit and words, which earlier pools' labels leave out)
    # round 24 (a key line's value changed again, readings of one line as one value): 0.9921 / 0.8563 / 0.6488
    # round 25 (a value found again, wider, at its key: the line's value): 0.9921 / 0.8563 / 0.6523
    # round 40: 0.9936 / 0.9791 / 0.6559
    # round 44: 0.9936 / 0.9791 / 0.7634; round 55: 0.9952 / 0.9827 / 0.7634 (ElevenLabs webhooks, JSON items
    # named as code, moved: a tool order)
    "heldout21": (0.995, 0.982, 0.763),
    # the twenty-second (measured 0.917 / 0.867 / 0.576), tune side since heldout23: 0.9906 / 0.9829 / 0.7506
    # (cues, a queue in words, a show clock's act, a wind whose gusts appear read as edits the first time they
    # change; labels that take in a value's unit and words)
    # round 24 (a state with its reason in brackets on its first change): 0.9953 / 0.9911 / 0.8123
    # round 25: 0.9953 / 0.9911 / 0.8294
    # round 28 (a value found again, wider, from before it): 0.9953 / 0.9911 / 0.8391
    # round 44: 0.9969 / 0.9940 / 0.8526
    "heldout22": (0.996, 0.993, 0.852),
    # the twenty-third (measured 0.923 / 0.787 / 0.477), tune side since heldout24: 0.9859 / 0.9672 / 0.8156
    # (states and counts in words, a countdown that loses its hours, a crew list that grows, a path and
    # timings of a dev server's line read as edits the first time they change; a summary the model's
    # acknowledgement follows; a summary appended to the system text; Apex actions and a Copilot plugin's
    # functions; labels that take in a value's unit, weekday and target time)
    # round 25: 0.9859 / 0.9672 / 0.8225
    # round 44: 0.9859 / 0.9672 / 0.8676
    "heldout23": (0.985, 0.967, 0.867),
    # the twenty-fourth (measured 0.919 / 0.653 / 0.550), tune side since heldout25: 0.9380 / 0.6960 / 0.6268
    # (29 values in a `document` content part of a chat message, which vLLM refuses and the gateway does not
    # render, labelled as if an engine saw them change; Zed's new thread from a summary read as a new
    # conversation; a timetable's raised minutes, pytest's summary line gaining a count, a kiln car's number
    # read as edits the first time they change)
    # round 40: 0.9395 / 0.6981 / 0.6307
    # round 44: 0.9395 / 0.6981 / 0.7102
    "heldout24": (0.939, 0.698, 0.710),
    # the twenty-fifth (measured 0.966 / 0.827 / 0.621), tune side since heldout26: 0.9969 / 0.9940 / 0.6854
    # (a possessive key, a state with its detail after a comma, military date-time groups, MATLAB's and
    # Wolfram's tool forms, values in a chat widget's welcome message; labels that take in a value's words)
    # round 28 (a state and its reading, whole; a value found again, wider, from before it): 0.9969 / 0.9939 / 0.7282
    # round 44: 0.9969 / 0.9940 / 0.8564
    "heldout25": (0.996, 0.993, 0.856),
    # the twenty-sixth (measured 0.969 / 0.888 / 0.682), tune side since heldout27: 0.9953 / 0.9911 / 0.7065
    # (schema.org potentialAction lists, opencode's compaction, a state with its detail, labels that take
    # in a value's key words)
    # round 28 (a state replaced by another with its reading): 0.9969 / 0.9939 / 0.7098
    # round 44: 0.9984 / 0.9969 / 0.8217
    "heldout26": (0.998, 0.996, 0.863),
    # the twenty-seventh (measured 0.951 / 0.926 / 0.638), tune side since heldout28: 0.9825 / 0.9817 / 0.8545 (round 36)
    # (REST Client request files as tool lists; a state's word before its reading, a state replaced by one with
    # its reading; uptime's days and clock, a clock with its date after it, a reading with its capacity;
    # values at the very end of the system text labelled breaks, with less than `material` reusable text after)
    # round 44: 0.9825 / 0.9817 / 0.9455
    "heldout27": (0.982, 0.981, 0.945),
    # the twenty-eighth (measured 0.935 / 0.760 / 0.641), tune side since heldout29: 0.9769 / 0.9617 / 0.7018
    # (API Blueprint resources as tool lists; AutoGen's window that keeps its head and drops from the middle;
    # Pydantic AI's summary asked for by a system instruction; a card payment's codes; a run's day and clock;
    # cuts with less than `material` reusable text after them labelled front trims; labels that take in a
    # status line's other readings, `284 passed, 1 skipped in 7.10s`)
    # round 40: 0.9770 / 0.9618 / 0.7396
    # round 44: 0.9770 / 0.9618 / 0.7472
    "heldout28": (0.976, 0.961, 0.747),
    # the twenty-ninth (measured 0.964 / 0.940 / 0.412), tune side since heldout30: 0.9937 / 0.9929 / 0.4266 (round 35)
    # (WIT interface files as tool lists; a booking code's one number and a number after `#` that rose, an
    # entry code drawn again, a state replaced by a reading with its state's word; labels that take in a
    # value's key, `Sec-WebSocket-Key: …`, where the span is the value alone)
    # round 44: 0.9937 / 0.9929 / 0.4685
    # round 46: 0.9937 / 0.9929 / 0.4825
    "heldout29": (0.993, 0.992, 0.482),
    # the thirtieth (measured 0.962 / 0.879 / 0.640), tune side since heldout31: 0.9892 / 0.9803 / 0.6558
    # (Google ADK's compaction, its long summary the model's message opening the history; a time ago with its
    # unit abbreviated or in German, a state's detail after a colon, four decimals after a comma; station
    # counts, running numbers and labels that take in a value's words)
    # round 40: 0.9923 / 0.9855 / 0.6739
    # round 44: 0.9923 / 0.9855 / 0.8625
    "heldout30": (0.992, 0.985, 0.862),
    # the thirty-first (measured 0.966 / 0.794 / 0.678, one look-alike alarm), tune side since heldout32:
    # 0.9938 / 0.9884 / 0.6817, no alarm (Nushell modules as tool lists; old tool results cleared in place as a
    # compaction; a rule's minimum after German `ab`; labels that take in a value's words)
    # round 40: 0.9938 / 0.9884 / 0.6917
    # round 44: 0.9938 / 0.9884 / 0.8321
    "heldout31": (0.993, 0.988, 0.832),
    # the thirty-second (measured 0.923 / 0.808 / 0.697), tune side since heldout33: 0.9703 / 0.8927 / 0.7039 (round 36)
    # (KDL nodes and CUE definitions as tool lists; CrewAI's compaction of the whole prompt into one user
    # message, which a new conversation without a system prompt also looks like; scores, race numbers, boat
    # counts and states read as edits the first time they change)
    # round 40: 0.9703 / 0.8927 / 0.7263
    # round 44: 0.9734 / 0.8968 / 0.9111
    # round 76: 0.9734 / 0.8968 / 0.9278 (a web server's access log line read whole: its clock in brackets)
    "heldout32": (0.973, 0.896, 0.927),
    # the thirty-third (measured 0.943 / 0.823 / 0.696), tune side since heldout34: 0.9825 / 0.9708 / 0.7660 (round 39)
    # (values in Codex CLI's environment block, a user message of its own; crontab lines as a tool list;
    # values in forms no rule reads on their first change; labels that take in a value's words)
    # round 40: 0.9841 / 0.9731 / 0.7692
    # round 44: 0.9856 / 0.9755 / 0.8836
    # round 45: 0.9904 / 0.9829 / 0.8924
    # round 58: 0.9936 / 0.9883 / 0.8982 (a repair café's tally, counts before their names, one changed)
    "heldout33": (0.993, 0.988, 0.898),
    # the thirty-fourth (measured 0.933 / 0.709 / 0.683), tune side since heldout35: 0.9953 / 0.9911 / 0.7507
    # (Dhall's record lists and a shell alias file as tool lists; Cline's condense, the summary in a tool
    # call's arguments; a word clock, a state held for hours and minutes, a record's id with its note; a
    # running count and a board number still read as edits the first time they change)
    # round 40: 0.9953 / 0.9911 / 0.7612
    # round 44: 0.9984 / 0.9969 / 0.8877
    "heldout34": (0.998, 0.996, 0.887),
    # the thirty-fifth (measured 0.922 / 0.695 / 0.675), tune side since heldout36: 0.9867 / 0.9780 / 0.6995
    # (a HOCON file and git's aliases as tool lists; the Vercel AI SDK's pruning of tool calls; a word clock's
    # sentence with its full stop, states of five words; running numbers with a note, `seq 2, train 5
    # (parcels)`, and crew counts still read as edits the first time they change)
    # round 40: 0.9867 / 0.9780 / 0.7565
    # round 44: 0.9867 / 0.9780 / 0.8497
    # round 45: 0.9917 / 0.9856 / 0.8586
    "heldout35": (0.991, 0.985, 0.858),
    # the thirty-sixth (measured 0.973 / 0.923 / 0.663), tune side since heldout37: 0.9969 / 0.9743 / 0.6634
    # (an INI file's `[tool:name]` sections as a tool list; aider's summary of the older head, which keeps
    # more than half of the history, still read as a front trim; labels that take in a value's note)
    # round 40: 0.9969 / 0.9743 / 0.7366
    # round 44: 0.9969 / 0.9743 / 0.8585
    # round 56: 0.9984 / 0.9878 / 0.8585 (a summary opening a shorter history in place of its first turns: a
    # compaction)
    "heldout36": (0.998, 0.987, 0.858),
    # the thirty-seventh (measured 0.981 / 0.800 / 0.635), tune side since heldout38: 0.9951 / 0.8694 / 0.6683
    # (AutoGen's message token limiter, messages cut in place; log lines whose stamp and message changed; a
    # burn time in days and hours; running numbers with a note, `Nr. 31 (Buche/Eiche)`, still read as edits
    # the first time they change, and in a context block as a history edit, which costs macro-F1 a class)
    # round 40: 0.9968 / 0.9940 / 0.7065
    # round 44: 0.9968 / 0.9940 / 0.8507
    # round 45: 1.0000 / 1.0000 / 0.8614
    "heldout37": (1.0, 1.0, 0.861),
    # the thirty-eighth (measured 0.915 / 0.756 / 0.762), tune side since heldout39: 0.9853 / 0.9575 / 0.7853
    # (an Org file's headings and doskey's macros as tool lists; Serilog's log lines, an ISO 8601 duration in
    # hours and minutes, a state's detail with its reading, minutes and seconds in primes; running numbers
    # with a note, `Op. 216 (cello)`, still read as edits the first time they change)
    # round 40: 0.9870 / 0.9601 / 0.8042
    # round 44: 0.9870 / 0.9601 / 0.9556
    # round 45: 0.9951 / 0.9740 / 0.9742
    # round 77: 0.9967 / 0.9778 / 0.9794 (tools moved inside a code block)
    # round 78: 0.9967 / 0.9778 / 0.9845 (a board dated and stamped read whole)
    "heldout38": (0.996, 0.977, 0.984),
    # the thirty-ninth (measured 0.948 / 0.799 / 0.441), tune side since heldout40: 0.9935 / 0.9789 / 0.5594
    # (markup directives as a tool list, the newest entry a `Last …` key names, a reference written as a
    # creditor reference, a countdown `on the clock`, a context block's key line; states replaced by
    # others, channel levels and a merged summary still missed; its labels take in a value's words)
    # round 44: 0.9952 / 0.9817 / 0.8895
    # round 56: 0.9968 / 0.9940 / 0.8895 (a summary opening the history in place of its first turns: a compaction)
    # round 65: 0.9984 / 0.9969 / 0.8924 (states with two details or seven words read whole)
    "heldout39": (0.998, 0.996, 0.892),
    # the fortieth (measured 0.944 / 0.903 / 0.619), tune side since heldout41: 0.9936 / 0.9883 / 0.6190
    # (a Prolog file's tool/3 facts under PlDoc comments and a `sudo -l` listing as tool lists; a state
    # replaced by another, a bout's score and a voucher code with its check symbol still read as edits the
    # first time they change; its labels take in a value's words)
    # round 44: 0.9936 / 0.9883 / 0.9471
    # round 65: 0.9952 / 0.9911 / 0.9499 (states with two details or seven words read whole)
    "heldout40": (0.995, 0.991, 0.949),
    # the forty-first (measured 0.961 / 0.936 / 0.821), tune side since heldout42: 0.9919 / 0.9857 / 0.8262
    # (a modem's AT command listing as a tool list; a checksum as a hex literal, a flight card's code whose
    # last number rose; a countdown's hold, a booking's code glued to its letters, counts and a game's score
    # still read as edits the first time they change)
    # round 44: 0.9919 / 0.9857 / 0.9270
    # round 45: 0.9936 / 0.9884 / 0.9296
    # round 46: 0.9936 / 0.9884 / 0.9397
    # round 59: 0.9952 / 0.9911 / 0.9424 (a record whose first part names the entry by an id that rose)
    "heldout41": (0.995, 0.991, 0.942),
    # the forty-second (measured 0.922 / 0.802 / 0.802), tune side since heldout43: 0.9650 / 0.8692 / 0.8023
    # (Robot Framework keywords, an OCaml interface and a docopt usage listing as tool lists; a compaction
    # that replaces the history chunk by chunk still read as a new conversation, 16 values still read as
    # edits the first time they change)
    # round 44: 0.9666 / 0.8712 / 0.9159
    # round 45: 0.9713 / 0.8777 / 0.9253
    # round 46: 0.9713 / 0.8777 / 0.9598
    # round 50: 0.9713 / 0.8777 / 0.9655
    # round 58: 0.9777 / 0.8871 / 0.9773 (sightings, counts before their names, one changed)
    # round 59: 0.9809 / 0.8922 / 0.9831 (transponders under a `Zuletzt …` key)
    "heldout42": (0.985, 0.900, 0.991),
    # the forty-third (measured 0.976 / 0.945 / 0.855), tune side since heldout44: 0.9984 / 0.9897 / 1.0000
    # (a C header's prototypes, a D-Bus introspection file and a task listing as tool lists, found by earlier
    # rules; states, counts, departures and readings read whole on their first change, and Claude Code's
    # compaction with the files read last restored after the summary; one such compaction whose restored files
    # leave more than half of the messages is still read as a new conversation)
    "heldout43": (0.998, 0.989, 1.0),
    # the forty-fourth (measured 0.924 / 0.808 / 0.946), tune side since round 45: 1.0000 / 1.0000 / 0.9749
    # (Claude Code's custom slash commands and PowerShell functions as tool lists, Codex CLI's rebuilt history,
    # a lavender still's charges, running walks with their notes and tallies of which two counts changed, all
    # read by round 45's rules; spans of longer statuses, `closed, next safe crossing from 15:57 (in 3 h 13
    # min)`, still read as their time)
    # round 46: 1.0000 / 1.0000 / 1.0000
    "heldout44": (1.0, 1.0, 1.0),
    # the forty-fifth (measured 0.986 / 0.976 / 0.897), tune side since round 46: 0.9952 / 0.9911 / 0.9481
    # (GitHub Actions workflows and Puppet Bolt task metadata as tool lists and the pi agent's compaction, read by
    # earlier rules; kayak trips with their notes, card payments and a ropes course read by round 46's rules; a
    # tunnel's URL labelled whole where its subdomain's hex changed still missed on its first change)
    "heldout45": (0.995, 0.991, 0.948),
    # the forty-sixth (measured 0.950 / 0.911 / 0.942), tune side since round 47: 0.9839 / 0.9650 / 0.9584
    # (Discord application commands as a tool list and a smokehouse kiln's status long by its note, read by
    # round 47's rules; a Slack manifest's slash commands and goose's compaction read by earlier rules; payments
    # whose value is longer than 64 characters, a ticket code and a proof link still read as edits the first
    # time they change)
    # round 49: 0.9887 / 0.9725 / 0.9670; round 52: 0.9920 / 0.9779 / 0.9727 (two proof links read whole: a newest
    # entry's link path with its drawn id counts as one token, as a base64 signature does)
    # round 59: 0.9952 / 0.9836 / 0.9783 (a state's detail that ends in a clock)
    "heldout46": (0.995, 0.983, 0.978),
    # the forty-seventh (measured 0.931 / 0.880 / 0.941), tune side since round 48: 1.0000 / 1.0000 / 0.9950
    # (Gemini CLI's custom commands and a Raycast extension's commands as tool lists, SumUp payments, karting
    # heats and a trek's countdown read by round 48's rules; Crush's compaction read by earlier rules; a hive
    # scale's reading of 58 characters still read as one of its numbers)
    # round 49: 1.0000 / 1.0000 / 1.0000
    "heldout47": (1.0, 1.0, 1.0),
    # the forty-eighth (measured 0.958 / 0.933 / 0.835), tune side since round 49: 0.9967 / 0.9939 / 0.9348
    # (PDM's scripts table in box-drawing characters, Klarna payments, piano workshop jobs, a daycare's tally,
    # a tailor's cloth bolts, a stove's test firing, a tuner's round, a skatepark's sessions and switches to another
    # agent over the same opening sentence read by round 49's rules; a grooming salon's tables and a carriage
    # timetable, longer than a status is read whole, still read as their clock)
    # round 50: 0.9967 / 0.9939 / 0.9946; round 53: 1.0000 / 1.0000 / 1.0000 (a daycare's tally with one count
    # changed read whole)
    "heldout48": (1.0, 1.0, 1.0),
    # the forty-ninth (measured 0.995 / 0.982 / 0.966), tune side since round 50: 0.9984 / 0.9878 / 1.0000
    # (an iOS app's App Intents and a Jenkins Job DSL seed script as tool lists, read by earlier rules; a brass band's
    # chairs, a chimney sweep's round and a driving school's diary board read by round 50's rules; a compaction
    # after Forge's whose kept window opens with a reply still read as a front trim)
    # round 56: 1.0000 / 1.0000 / 1.0000 (Forge's compaction: its summary opens the kept window)
    "heldout49": (1.0, 1.0, 1.0),
    # the fiftieth (measured 0.960 / 0.858 / 0.960), tune side since round 51: 0.9936 / 0.9883 / 0.9894
    # (the Continue CLI's compaction, troff manual pages, New Relic request lines, precious metal prices,
    # a music school's register and a contract round's stamped status read by round 51's rules; Excel custom
    # functions read by earlier rules; a club's occupancy and a repair bench's counts still read as edits
    # on their first change); round 55: 0.9952 / 0.9911 / 0.9921 (New Relic's request lines, a machine-readable
    # code with a drawn part counted as one token)
    "heldout50": (0.995, 0.991, 0.992),
    # the fifty-first (measured 0.966 / 0.778 / 0.961), tune side since round 52: 0.9984 / 0.9970 / 0.9976
    # (LangChain's summary buffer memory, its transcript in one user message grown in place and compacted by a
    # summary line, card payments with their amount and result, Dropbox links, pretix orders, TSE receipts and a
    # choir's seats read by round 52's rules; one pretix order whose codes are letters on both sides still read
    # as an edit)
    # round 56: 1.0000 / 1.0000 / 1.0000 (the pretix order with letters on both sides, a record replaced)
    "heldout51": (1.0, 1.0, 1.0),
    # the fifty-second (measured 0.973 / 0.910 / 0.859, one look-alike alarm), tune side since round 53: 0.9968 /
    # 0.9940 / 0.9847 (LangGraph's summary as a system message, fish shell completions, Google Forms links, quay and
    # dispatch boards stamped with their clock, OCT scans with their DICOM UID, an optician's trays and a rule's
    # return time edited read by round 53's rules; a stable's yard board, a payment gateway's `status=… txid=…`
    # line and geohash drops still read as an edit or as the geohash)
    # round 56: 0.9984 / 0.9969 / 0.9924 (geohash drops, a record replaced)
    "heldout52": (1.000, 1.000, 0.994),
    # the fifty-third (measured 0.973 / 0.898 / 0.954, one look-alike alarm), tune side since round 54: 0.9936 /
    # 0.9876 / 0.9925 (the Anthropic SDKs' tool runner compaction, Dropbox Sign requests, Swiss QR-bill references,
    # WeTransfer links, MOT test numbers, a guides' office board with a dotted clock and a rule's first booking
    # time edited read by round 54's rules; autoclave cycles, a mountain weather reading and tldr pages reordered
    # once still read as edits)
    # round 77: 0.9952 / 0.9911 / 0.9925 (tools moved inside a code block)
    "heldout53": (0.995, 0.991, 0.992),
    # the fifty-fourth (measured 0.960 / 0.895 / 0.948), tune side since round 55: 0.9968 / 0.9940 / 0.9949 (a
    # Postman collection's requests, AutoGPT's running summary, Airbnb reservations, Austrian receipts with their
    # signed code and changeover boards up to 240 characters read by round 55's rules; ski binding tests still
    # read as edits)
    # round 64: 1.0000 / 1.0000 / 1.0000 (the ski binding tests, records with every part replaced, read whole)
    "heldout54": (1.0, 1.0, 1.0),
    # the fifty-fifth (measured 0.974 / 0.910 / 0.950), tune side since round 56: 0.9822 / 0.9221 / 0.9634
    # (darts checkouts and curling deliveries read by round 56's rules; Griptape's rolling summary rewritten over
    # a window of the same length kept a front trim, as issue 29 defines it, against this split's labels; a darts
    # leg's scores, a paragliding school's day count, curling scores after an end and a flower auction's clock
    # still read as edits or one number)
    "heldout55": (0.987, 0.930, 0.976),
    # the fifty-sixth (measured 0.964 / 0.940 / 0.974), tune side since round 57: 1.0000 / 1.0000 / 1.0000 (a chat
    # bot's Hubot help lines, skittles tallies after what they are of, a relay's heat scores, bank credits with their
    # particulars, code and reference, and a skittles throw with its pins read by round 57's rules)
    "heldout56": (1.0, 1.0, 1.0),
    # the fifty-seventh (measured 0.991 / 0.983 / 0.975, issue 29's goal met), tune side since round 58: 1.0000 /
    # 1.0000 / 0.9950 (a tunnel washer's batches, a donor session's tally with its note, states whose words hold an
    # apostrophe and a delivery board stamped with its clock read by round 58's rules; a judo mat's scoreboard, its
    # clock second, still read as the clock when only the clock moved on)
    "heldout57": (1.0, 1.0, 0.995),
    # the fifty-eighth (measured 0.953 / 0.937 / 0.896), tune side since round 59: 0.9887 / 0.9803 / 0.9749
    # (records named by a drawn code or a rising id under any key, `Zuletzt …` keys, prices beside counts, minutes
    # played, states of six words and with a clock read by round 59's rules; race, croquet and show class results
    # drawn again still read as edits)
    # round 60: 0.9919 / 0.9855 / 0.9861 (check-ins, results and claims under keys that name their event; records
    # whose code changed alone read whole)
    # round 64: 0.9952 / 0.9910 / 0.9917 (a result record with every part replaced read whole)
    "heldout58": (0.995, 0.991, 0.991),
    # the fifty-ninth (measured 0.980 / 0.841 / 0.960), tune side since round 60: 0.9934 / 0.9883 / 0.9845
    # (SWE-agent's elided observations, wristband scans, bingo claims, a hostel's check-ins and a notary's deed
    # numbers read by round 60's rules; a bingo board's called numbers and letter-only wristband codes still read as
    # edits)
    # round 61: 0.9951 / 0.9911 / 0.9871 (a wristband's letter-only code, drawn again in the record, whole)
    "heldout59": (0.995, 0.991, 0.987),
    # the sixtieth (measured 0.974 / 0.926 / 0.893, one look-alike alarm), tune side since round 61: 0.9886 / 0.9476 /
    # 0.9946 (railway boards whose first part opens with a train's time, bar tabs, door scans, a till's sale that lost
    # parts, tickets issued and a rule's doors time edited to a quarter read by round 61's rules; VoltAgent's summary
    # refolded over a window of the same length still read as an edited template, and a token handover as an edit)
    "heldout60": (0.988, 0.947, 0.994),
    # the sixty-first (measured 0.988 / 0.970 / 0.973, issue 29's goal met), tune side since round 62: 0.9985 /
    # 0.9970 / 0.9878 (aichat's second recap and signed waivers read by round 62's rules; a regatta heat's result drawn
    # again and a theatre's seats board still read as an edit or one number)
    "heldout61": (1.000, 1.000, 0.990),
    # the sixty-second (measured 0.970 / 0.879 / 0.974), tune side since round 63: 1.0000 / 1.0000 / 1.0000 (the
    # BeeAI Framework's SummarizeMemory, tote pools, people's pieces, numbered harness checks and states whose detail
    # opens with a number read by round 63's rules; a rule's age bound beside a height no longer read as a reading)
    "heldout62": (1.000, 1.000, 1.000),
    # the sixty-third (measured 0.969 / 0.842 / 0.906), tune side since round 64: 0.9773 / 0.8522 / 0.9734 (tide
    # boards stamped with their zone, tennis results and running set scores, a points table and train reports read
    # by round 64's rules; AnythingLLM's array compressor, labelled a compaction, stays a front trim or an edited
    # template as issue 29 defines it, and results of other shapes keyed as results still read as edits)
    # round 65: 0.9789 / 0.8543 / 0.9761 (a sea state with a code in it read whole)
    "heldout63": (0.980, 0.856, 0.978),
    # the sixty-fourth (measured 0.977 / 0.816 / 0.937), tune side since round 65: 0.9968 / 0.9940 / 0.9901
    # (Langroid's truncated history, states with two details, codes or seven words, and a Christmas market's board
    # stamped with its date read by round 65's rules; a tombola draw read as its clock, a rugby match sheet's entry
    # and a toll road's fog with its heights still read as edits); round 76: 0.9968 / 0.9940 / 0.9950
    "heldout64": (0.996, 0.994, 0.995),
    # the sixty-fifth (measured 0.940 / 0.816 / 0.951), tune side since round 66: 0.9742 / 0.8695 / 0.9839 (gulp's
    # task tree, Tcl cmdline procs, a leaderboard's scores to one decimal and states of eight words read by round
    # 66's rules; LlamaIndex's summary buffer, labelled a compaction, kept a front trim as issue 29 defines it, its
    # rewrites still read as an edited template; results, announcements and a rider's penalties still read as edits);
    # round 76: 0.9774 / 0.8741 / 0.9893
    "heldout65": (0.977, 0.874, 0.989),
    # the sixty-sixth (measured 0.969 / 0.904 / 0.964), tune side since round 67: 0.9789 / 0.9210 / 0.9751 (Racket
    # command-line functions and a market board naming its year read by round 67's rules; Agno's session summaries,
    # labelled compactions, kept edited templates as they are paid on every run; states of nine words, a stall's
    # notice and a market's tally still read as edits or one number)
    "heldout66": (0.980, 0.923, 0.983),
    # measured once at e5f70ee (0.957 / 0.869 / 0.942); after round 68 (a CMake Makefile's `help`
    # targets, NextChat's summary before the system prompt, attempts, verdicts and queues read whole, boards
    # stamped with a date in words or seconds; a beer tent's notice and a caber's attempt still read as edits)
    "heldout67": (0.996, 0.994, 0.995),
    # measured once at 69f0d1b (0.946 / 0.920 / 0.866); after round 69 (a Bazel query's label_kind listing,
    # boards stamped with `»`, `;`, a clock to the second or a place's name, header lines opening the system
    # prompt with a short code read whole; wristbands, regatta finishes, lost property and states still read as edits)
    "heldout68": (0.986, 0.977, 0.979),
    # measured once at f4cfb19 (0.959 / 0.928 / 0.920); after round 70 (a pipx listing, cinema boards stamped
    # after their place, police log entries led by a risen number and numbered items' reports read whole; a chair
    # umpire's code violations, a reseating and a fair badge still read as edits; a working memory's summary over
    # more than half of the history kept read as a front trim, as round 20's labels have it)
    "heldout69": (0.988, 0.971, 0.984),
    # measured once at 7913e79 (0.958 / 0.871 / 0.862); after round 71 (Hermes Agent's summary between the first
    # and the newest messages, Janet functions, boards stamped after a place, a day and a date, welfare logs and
    # marshals' calls read whole; boards stamped with `Uhr:`, half-price offers and a gate check still missed);
    # round 76: 0.9904 / 0.9824 / 0.9399
    "heldout70": (0.990, 0.982, 0.939),
    # measured once at 9085434 (0.973 / 0.898 / 0.912); after round 72 (Haystack's summary of the whole
    # transcript, boards stamped with any sign, tallies of parts set apart by dashes and wristband scans read
    # whole; third-umpire reviews and a tram dispatch still read as edits; transcripts that only lost a blank
    # line, labelled compactions, read as new conversations)
    "heldout71": (0.987, 0.956, 0.985),
    # measured once at bf4a590 (0.972 / 0.804 / 0.926); after round 73 (a summary in place of the first message,
    # boards set apart by runic punctuation or stamped after a date and a dash, stewards' radio calls, a tower's
    # calls in Zulu time and jousting passes read whole; Strands' summary of a summary over a window that keeps
    # its length read as a front trim, a park-and-ride's states still read as edits)
    "heldout72": (0.991, 0.963, 0.994),
    # measured once at 23b6a8b (0.995 / 0.985 / 0.924, two look-alike alarms); after round 74 (a rule's hour in a
    # listed sentence edited off the hour stays an edit, boards dated in Roman numerals or in brackets or named
    # before a sign read whole, CAMEL's summary after its earlier one read as a compaction; a swan marker's report
    # opening with a quote still read as its clock)
    # round 78: 1.0000 / 1.0000 / 0.9951
    "heldout73": (1.000, 1.000, 0.995),
    # measured once at 917b945 (0.981 / 0.900 / 0.943); after round 75 (boards named with digits or long words,
    # tallies and records set apart by any sign, marshals' and course posts' reports read whole; LibreChat's summary
    # refined at every request before the instructions read as an edited template with a front trim, a rolling
    # summary, paid on every request); round 76: 0.9872 / 0.9095 / 0.9949
    "heldout74": (0.987, 0.909, 0.994),
    # measured once at 88c0802 (0.972 / 0.920 / 0.847); after round 76 (boards and reports stamped with twelve-hour
    # clocks or `Uhr`, Hare's getopt subcommands and Elvish functions named in one word, Agent Zero's summaries
    # merged into the first user message kept read by round 76's rules)
    "heldout75": (1.000, 1.000, 1.000),
    # measured once at b56f657 (0.967 / 0.793 / 0.930, one look-alike alarm); after round 77 (Suna's summary in place
    # of every message, GDB's `help user-defined` listing, Clojure option specs, a rule's hour given twice, boards
    # stamped `4:09a`, `10⁵² Uhr` or in two languages read by round 77's rules)
    "heldout76": (1.000, 1.000, 1.000),
    # measured once at 8610baa (0.973 / 0.929 / 0.784, one look-alike alarm); after round 78 (boards stamped with a
    # dated clock to the second, a dotted clock after a date or a two-letter zone, Helm's plugin list, ArgParse.jl
    # commands in their code block, Pipecat's first summary and a rule's hour in a note read by round 78's rules;
    # Pipecat's second summary, rewritten over a window of the same length, kept a front trim)
    "heldout77": (0.998, 0.988, 0.992),
    # measured once at f2ed4c1 (0.995 / 0.991 / 0.992, no look-alike alarm); after round 79 (a rental's record
    # named by a long zero-padded number and launch directors' calls stamped with a zone read by round 79's rules)
    "heldout78": (1.000, 1.000, 1.000),
    # measured once at be8811d (0.992 / 0.960 / 0.855, no look-alike alarm); after round 80 (SummarizingChatReducer's
    # summaries, a notice stamped `11pm` and a board dated `08-11-2027` read by round 80's rules)
    "heldout79": (1.000, 1.000, 1.000),
    # measured once at ca4ee7b (0.979 / 0.932 / 0.962, two look-alike alarms); after round 81 (a rule's twelve-hour
    # clocks, `2245H`, a receipt risen by 1%, a board after four words and Spring AI's memory in the system text
    # read by round 81's rules; its window memory's trims read as front trims, which its labels call compactions)
    "heldout80": (0.993, 0.954, 1.000),
    # measured once at 33427bd (0.985 / 0.904 / 0.987, no look-alike alarm); after round 82 (its market board set
    # apart by `::`, its clock read out in words, read by round 82's rules; its window trims read as front trims,
    # which its labels call compactions)
    "heldout81": (0.987, 0.907, 1.000),
    # measured once at 61bee86 (0.960 / 0.838 / 0.963, no look-alike alarm); after round 83 (xbps-query's listing,
    # its receipts numbered after `Nr.` in thousands, its raffle tickets and its board on a festival's day of its run
    # read by round 83's rules; Mastra's window trims read as front trims, which its labels call compactions)
    "heldout82": (0.983, 0.887, 1.000),
    # measured once at e3ab0d4 (0.971 / 0.852 / 0.817, no look-alike alarm); after round 84 (its boards set apart by
    # hyphens typed for dashes or dated `Montag, 29. Juli`, its logged calls `[09:44 HKT] …` and its agents named in
    # camel case read by round 84's rules; LangBot's window trims read as front trims, which its labels call compactions)
    "heldout83": (0.975, 0.856, 1.000),
    # measured once at 6fddc6c (0.992 / 0.939 / 0.903, no look-alike alarm); after round 85 (its Cup Match, regatta,
    # Styrian and Perahera boards read by round 85's rules; the Flowise window's trims read as front trims, which its
    # labels call compactions)
    "heldout84": (0.992, 0.938, 1.000),
    # measured once at d3687b8 (0.982 / 0.934 / 0.930, no look-alike alarm); after round 86 (its tickets after `No.`,
    # its route states, its reports stamped `@ 9:16 pm:` and `(17.21 Uhr):` and its tallies in semicolons read by
    # round 86's rules; Chatbox's window trims read as front trims, which its labels call compactions; a report
    # stamped with its clock in words read as an edit)
    "heldout85": (0.992, 0.950, 0.997),
    # measured once at b42982e (0.981 / 0.959 / 0.985, two look-alike alarms); after round 87 (zypper search's table
    # with its status column, the race day's rule on the quarter hour after `at about` and its reports stamped `as of`
    # their clock read by round 87's rules)
    "heldout86": (1.0, 1.0, 1.0),
    # measured once at fce3beb (0.992 / 0.985 / 0.982, one look-alike alarm); after round 88 (its store orders after
    # three words and an abbreviation, its state opening with an ordinal and its marathon's rule moved back two
    # minutes read by round 88's rules)
    "heldout87": (1.0, 1.0, 1.0),
    # measured once at e902800 (0.997 / 0.994 / 0.984, no look-alike alarm); after round 89 (its expo orders whose
    # numbers alone changed after their sign and its tram boards stamped `[So 12:44]` read by round 89's rules; a
    # report stamped with a clock that stayed, its words replaced, still read as an edit)
    "heldout88": (0.998, 0.996, 0.997),
}
# look-alike alarms a tune-side split keeps: an edit that two requests cannot tell from a new draw
# (heldout11: a Nano-ID-shaped tenant prefix edited into another random-looking one; heldout13: a pinned
# Vite asset's hash edited; heldout18: an age group edited once, `Under-18s` -> `Under-16s`; heldout20: a
# release's `4.3`)
LOOKALIKE_ALARMS = {"heldout11": 1, "heldout13": 1, "heldout18": 1, "heldout20": 1}
# issue 29's goal on the held-out split (heldout89), measured once after the detector work on the tune
# side (docs/diagnosis.md, *Scoring*)
HELDOUT_GOAL_MACRO_F1 = 0.97
HELDOUT_GOAL_SPAN_F1 = 0.92
# the pools whose material the detector may have been developed against
TUNE_POOLS = ("tune", "heldout", "tune2", "heldout2", "heldout3", "heldout4", "heldout5", "heldout6", "heldout7",
              "heldout8", "heldout9", "heldout10", "heldout11", "heldout12", "heldout13", "heldout14",
              "heldout15", "heldout16", "heldout17", "heldout18", "heldout19", "heldout20", "heldout21",
              "heldout22", "heldout23", "heldout24", "heldout25", "heldout26", "heldout27", "heldout28", "heldout29", "heldout30", "heldout31", "heldout32", "heldout33", "heldout34", "heldout35", "heldout36", "heldout37", "heldout38", "heldout39", "heldout40", "heldout41", "heldout42", "heldout43", "heldout44", "heldout45", "heldout46", "heldout47", "heldout48", "heldout49", "heldout50", "heldout51", "heldout52", "heldout53", "heldout54", "heldout55", "heldout56", "heldout57", "heldout58", "heldout59", "heldout60", "heldout61", "heldout62", "heldout63", "heldout64", "heldout65", "heldout66", "heldout67", "heldout68", "heldout69", "heldout70", "heldout71", "heldout72", "heldout73", "heldout74", "heldout75", "heldout76", "heldout77", "heldout78", "heldout79", "heldout80", "heldout81", "heldout82", "heldout83", "heldout84", "heldout85", "heldout86", "heldout87", "heldout88")

# Words the held-out pool shares with a word list by coincidence: the list held them before the pool
# was written (word -> the commit that added them; `git log -S` shows it). Not for words added later.
BEFORE_THE_POOL = {
    "restliches": "c2bdc15, round 4 (`restlich\\w*` in `_LEFT`), before heldout5, heldout6 and heldout7 existed",
    "expires": "4614156, round 8 (`expires` in `_COUNTER_KEY`, a countdown's key; moved to value_kind.py by aca78d5), "
               "before heldout9 existed",
    "restlaufzeit": "35c8102, round 5 (`rest(?:…|laufzeit)\\w*` in `_REMAINING`, part of `_LEFT`), before heldout6 existed",
    "mbar": "e9d33c6, round 13 (`m?bar` in `_MEASURE_UNIT`), before heldout14 existed",
    "neuester": "88ddac0, round 40 (`neueste[rsn]?` in `LATEST_WORDS`), before heldout41 existed",
}

# the detector's word lists: every frozenset of words in app/prefix/dynamic.py and app/prefix/value_kind.py, and the regexes
# that recognise a key or a "now" cue by its words (the value-format patterns are not word lists)
KEY_PATTERNS = {name: getattr(value_kind, name) for name in ("_FLAG_KEY", "_DYNAMIC_KEY", "_WEEK_KEY", "_COUNTER_KEY",
                                                              "_TIMING_KEY", "_UNIT_AFTER", "_READING_UNIT",
                                                              "_MEASURE_UNIT", "_THRESHOLD_BEFORE")}
KEY_PATTERNS["NOW_CUE"] = dynamic.NOW_CUE
KEY_PATTERNS["_LEFT"] = re.compile(rf"(?i)(?:{dynamic._LEFT})")  # what is left of a budget, by its words
KEY_PATTERNS["LATEST_WORDS"] = re.compile(rf"(?i)\b(?:{value_change.LATEST_WORDS})\b")  # the newest entry's key (round 40)
WORD_SETS = {name: value for module in (dynamic, value_kind) for name, value in vars(module).items()
             if isinstance(value, frozenset) and all(isinstance(w, str) for w in value)}
assert {"_FLAG_WORDS", "WEEKDAY_NAMES"} <= set(WORD_SETS)  # the guard sees the lists where they live


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


@pytest.fixture(scope="module")
def heldout(fpr) -> Scores:
    return score(CORPORA[HELDOUT], fpr)


def test_floors_cover_the_tune_side_and_not_the_heldout_split() -> None:
    assert sorted(FLOORS) == sorted(TUNE_SIDE) and HELDOUT not in FLOORS


def assert_at_or_above_the_floor(fpr: Fingerprinter, corpus: str) -> None:
    """The tune-side split `corpus` scores at or above its floor and keeps its look-alike alarms."""
    s = score(CORPORA[corpus], fpr)
    accuracy, macro_f1, span_f1 = FLOORS[corpus]
    assert s.transitions >= 190
    assert s.accuracy >= accuracy and s.macro_f1 >= macro_f1 and s.span_exact_f1 >= span_f1, \
        (corpus, s.accuracy, s.macro_f1, s.span_exact_f1, s.errors[:10])
    assert s.lookalike_false_alarms <= LOOKALIKE_ALARMS.get(corpus, 0), s.errors[:10]


# every third split here, the others in tests/test_diagnosis_floors.py and tests/test_diagnosis_floors_last.py:
# `make test` hands each file to one worker, and the floors, one split's scoring each and a split more every
# round, would otherwise be the longest file of the suite and finish last
FLOOR_THIRDS = tuple(sorted(FLOORS)[part::3] for part in range(3))


# `make test` scores the newest RECENT_FLOORS splits, where a round's rules are likeliest to move a score;
# every older one carries the `floors` mark and is scored by `make test-floors`, which CI runs after
# `make test`: with a split more every round (~1.5 s of CPU each), all of them would carry `make test` past
# its four minutes
RECENT_FLOORS = 12


def floors_of(third: int) -> Callable[[Fingerprinter, str], None]:
    """The floors test of one third of the splits (FLOOR_THIRDS), for the file that holds it; the older
    splits' under the `floors` mark."""
    recent = set(TUNE_SIDE[-RECENT_FLOORS:])
    params = [pytest.param(c, marks=() if c in recent else pytest.mark.floors) for c in FLOOR_THIRDS[third]]

    @pytest.mark.parametrize("corpus", params)
    def test_scores_stay_at_or_above_the_floor(fpr: Fingerprinter, corpus: str) -> None:
        assert_at_or_above_the_floor(fpr, corpus)
    return test_scores_stay_at_or_above_the_floor


test_scores_stay_at_or_above_the_floor = floors_of(0)


def test_heldout_raises_no_lookalike_alarm(heldout: Scores) -> None:
    assert heldout.transitions >= 600
    assert heldout.lookalike_false_alarms == 0, heldout.errors[:10]


def test_heldout_span_f1_meets_the_goal(heldout: Scores) -> None:
    assert heldout.span_exact_f1 >= HELDOUT_GOAL_SPAN_F1, (heldout.span_exact_f1, heldout.errors[:10])


def test_heldout_macro_f1_meets_the_goal(heldout: Scores) -> None:
    assert heldout.macro_f1 >= HELDOUT_GOAL_MACRO_F1, (heldout.macro_f1, heldout.errors[:10])


def _corpus_values(split: str) -> set[str]:
    """The changing values (lower-cased) the labels of a committed corpus name."""
    out: set[str] = set()
    for line in CORPORA[split].read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        spans = row["spans"] if "requests" in row else [[row["span"]] if row.get("span") else []]
        out.update(v.lower() for vs in spans for v in vs)
    return out


def _tune_side_text() -> str:
    """Everything the detector may have been developed against: the tune-side pools and corpora."""
    return "\n".join([json.dumps(POOLS[p], ensure_ascii=False) for p in TUNE_POOLS]
                     + [CORPORA[c].read_text(encoding="utf-8") for c in TUNE_SIDE]).lower()


def _recognised_by(word: str, tune_text: str) -> list[str]:
    """The word lists that recognise `word` by something the tune side does not contain: as a
    member, or as a key/cue their regexes match in it (`Sprintwoche` by `woche`, a part of the
    tune pool's `Kalenderwoche`, is the detector generalising, not a held-out word in it)."""
    hits = [name for name, words in WORD_SETS.items() if word.lower() in words]
    return hits + [name for name, pattern in KEY_PATTERNS.items()
                   if (m := pattern.search(word)) and m.group(0).lower() not in tune_text]


def test_no_value_or_key_that_only_the_heldout_pool_uses_is_in_the_detectors_word_lists() -> None:
    """The held-out pool is `heldout89`: a value its labels name that no tune-side label names and
    (for a word) no tune-side text contains, and a word of its dynamic lines (the system text's and
    the first user message's context block's) that no tune-side text contains, must not be
    recognised by any word list of the detector."""
    tune_text = _tune_side_text()
    heldout_values = _corpus_values(HELDOUT)
    assert heldout_values, "the check below would not see the held-out pool's values"
    heldout_only = heldout_values - set().union(*(_corpus_values(c) for c in TUNE_SIDE))
    words = {v for v in heldout_only if re.fullmatch(r"[^\W\d_]+", v) and v not in tune_text}
    leaked = {v: hits for v in words if (hits := _recognised_by(v, tune_text))}
    leaked |= {v: hits for v in heldout_only - words if (hits := [n for n, ws in WORD_SETS.items() if v in ws])
               and v not in tune_text}
    pool = POOLS[HELDOUT]
    lines = [line for table in ("dynamic", "context_dynamic") for _, line, _ in sum(pool[table].values(), [])]
    key_words = {w.lower() for line in lines for w in re.findall(r"[^\W\d_]+", line.replace("{v}", " "))}
    held_keys = {w for w in key_words if w not in tune_text}
    assert len(held_keys) >= 2  # the check sees the held-out pool's own keys
    leaked |= {w: hits for w in held_keys if (hits := _recognised_by(w, tune_text))}
    leaked = {w: hits for w, hits in leaked.items() if w not in BEFORE_THE_POOL}
    assert not leaked, f"held-out-only words in the detector's word lists: {leaked}"
