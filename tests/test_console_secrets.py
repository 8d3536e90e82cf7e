"""
No console page renders a code, token, key or configuration body (issue
20 item 5; docs/design.md, the owner console), except the response of a
provision made there: every page an owner can reach with GET is fetched
over a fleet holding runs (their codes), a node's device-flow request (its
one-time code and device code), an approved request (its access token),
a login link and a session, and no page body holds any of them, nor a
PEM block, nor a line of the rendered configuration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from treq.testing import StubTreq

from tests.daemonsupport import UUID2
from tests.test_console_verify import DeviceFlowNodeCase

LINKS = re.compile(r'href="(/[^"#]*)"')


class NoSecretInAnyPageTests(DeviceFlowNodeCase):
    """Crawl the console as an owner and look for every secret fleetd holds."""

    async def test_crawl_noSecretAnywhere(self) -> None:
        await self.setUpDevice()
        await self.addDevice("w2", "SER2", UUID2)
        codes = await self.provision("w2")
        grant = await self.requestCode()
        token: dict[str, Any] = {}
        form = {"user_code": grant["user_code"], "device": "w1", "action": "approve"}
        await self.decide(form)
        status, token = await self.poll(grant)
        self.assertEqual(status, 200, token)
        link = await self.loginLink()
        secrets = [*codes.values(), grant["device_code"], token["access_token"],
                   urlsplit(link).query.split("=", 1)[1], "-----BEGIN"]  # fmt: skip
        secrets += self.configLines()
        secrets.append(self.csrf("bob"))  # another owner's token
        browser = StubTreq(self.root)
        code, headers, _ = await self.signIn(link, browser)
        self.assertEqual(code, 200)
        cookie = headers.getRawHeaders("set-cookie")[0].split(";")[0].split("=", 1)[1]
        secrets.append(cookie)

        seen: set[str] = set()
        todo = ["/", "/journal", "/device", f"/device?user_code={grant['user_code']}",
                "/devices/w1", "/devices/w2"]  # fmt: skip
        while todo:
            path = todo.pop()
            if path in seen or path.startswith("/static/") or len(seen) > 60:
                continue
            seen.add(path)
            status, _, body = await self.page("GET", path)
            self.assertIn(status, (200, 400, 404, 409), (path, body[:300]))
            for secret in secrets:
                self.assertNotIn(secret, body, f"{path} shows a secret")
            todo.extend(p.replace("&amp;", "&") for p in LINKS.findall(body))
        # the crawl reached the confirmation pages of every action
        for wanted in ("/devices/w1/provision", "/devices/w1/retire"):
            self.assertTrue(any(p.startswith(wanted) for p in seen), (wanted, seen))

    def configLines(self) -> list[str]:
        """Distinctive lines of the configurations fleetd rendered."""
        vault = Path(self.settings.vault)
        lines: list[str] = []
        for path in vault.iterdir():
            if path.is_file():
                text = path.read_text(errors="replace")
                lines += [line.strip() for line in text.splitlines()
                          if len(line.strip()) > 24][:5]  # fmt: skip
        self.assertTrue(lines, "no configuration in the vault to look for")
        return lines
