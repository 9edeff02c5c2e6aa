"""The README's curl and Python examples run as written (against the test server's port)."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
DEFAULT = "http://127.0.0.1:8000"
GRPC_DEFAULT = "127.0.0.1:8001"


def curl_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for command in re.split(r"\n(?=curl )", block.strip()):
            if command.startswith("curl "):
                commands.append("\n".join(line for line in command.splitlines() if not line.startswith("#")).split("  #")[0])
    return commands


def expected_output(command: str) -> str | None:
    """The '# ...' line the README shows under a command, if any."""
    after = README.split(command.splitlines()[-1], 1)[1].lstrip("\n")
    return after[2:].splitlines()[0] if after.startswith("# ") else None


@pytest.mark.parametrize("command", curl_commands(), ids=lambda c: c.split("http://127.0.0.1:8000")[1].split()[0])
def test_curl_examples(server, command):
    out = subprocess.run(["bash", "-c", command.replace(DEFAULT, server.url)], capture_output=True, text=True, check=True).stdout
    assert out
    if "/metrics" not in command:
        json.loads(out)
    shown = expected_output(command)
    if shown and "..." not in shown:
        assert json.loads(out) == json.loads(shown)
    elif shown:
        for piece in shown.split("..."):
            assert piece.strip("{},") in out


def test_python_examples(server, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks
    for block in blocks:
        # tritonclient takes host:port without the scheme
        code = block.replace(DEFAULT, server.url).replace(DEFAULT.removeprefix("http://"), server.url.removeprefix("http://"))
        exec(compile(code.replace(GRPC_DEFAULT, server.grpc), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "[-2.5 -1.5  0.   0.   0.   1.5  2.5]" in out
    assert sum("grpcclient" in block for block in blocks) == 3  # the gRPC examples: binary, a stream, shared memory
    assert out.count("[-2.5 -1.5  0.   0.   0.   1.5  2.5]") >= 4 and "True" in out


def test_configuration_table_names_every_setting():
    """Every Settings field is a row of README's configuration table (as VKACT_<NAME>), and every
    variable the table names is a setting the service reads."""
    from service.config import Settings

    table = README.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(VKACT_[A-Z0-9_]+)`", table))
    wanted = {f"VKACT_{name.upper()}" for name in Settings.model_fields}
    assert wanted == named, (wanted - named, named - wanted)


def test_the_data_type_table_is_current():
    """README's operator/data-type table is what scripts/types_table.py makes of the registry now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("types_table", Path(__file__).resolve().parents[2] / "scripts" / "types_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from service.descriptors import DataType

    assert sorted(module.COLUMNS) == sorted(DataType), "a data type without its column"
    assert f"{module.BEGIN}\n{module.table()}\n{module.END}" in README, "run: python scripts/types_table.py"
