"""`POST /hooks/github/`: what GitHub tells loopsweb about its pull requests and issues
(docs/revisions.md, "The webhook").

A delivery is taken in this order, and anything refused writes nothing:

1. **Configured.** Without LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE the endpoint answers 404; a
   secret file that cannot be read (agents.envfile: an absolute path, a regular 0600 file,
   no symlink) answers 503 and is logged.
2. **Size.** A body over LOOPSWEB_GITHUB_WEBHOOK_MAX_BYTES: 413 (judged on Content-Length,
   then on the bytes read).
3. **Signature.** `X-Hub-Signature-256` must be `sha256=` and the HMAC-SHA256 of the raw body
   with the secret, compared in constant time: else 401.
4. **Shape.** `X-GitHub-Delivery` and `X-GitHub-Event` present, the body a JSON object
   within loopsweb's JSON limits: else 400.
5. **Once.** The delivery id is recorded (`routing_github_deliveries`) in the transaction
   that acts on it: a redelivery answers 200 `duplicate` and does nothing again.

Then the event, every field of it untrusted text (findings are data in a prompt, escaped on
every page):

- `pull_request_review` `submitted` with state `changes_requested`, and
  `pull_request_review_comment` `created`, on a pull request loopsweb opened: a revision
  request (trigger `review`) with the review's body, the comment's `path:line` and the
  commit each was made on;
- `check_run` / `check_suite` `completed` with conclusion `failure` or `timed_out`, for
  the commit loopsweb pushed last to such a pull request: a revision request (trigger
  `check`) with the check's name, its summary and the URL of its logs (a check of an
  older commit is stale and ignored);
- `pull_request` `closed`: the item's waiting revisions are skipped, with why;
- `issues`: routing.github_intake (mapped repositories' labelled issues become tasks);
- `ping` and anything else: answered, nothing done.

Requests join the item's waiting revision and are due LOOPSWEB_REVISION_DEBOUNCE_SECONDS
after the last one (ledger.services.revisions); routing.revisions starts them.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents.envfile import EnvFileError, read_env_file
from domain.errors import ApplicationError
from domain.github_findings import (
    Finding,
    author_refusal,
    check_run_finding,
    check_suite_finding,
    comment_finding,
    obj,
    pull_numbers,
    review_finding,
)
from domain.jsontext import loads_limited
from ledger.services.revisions import items_of_pull_request, revisions_skip_waiting
from routing.api.views import read_body
from routing.github_intake import issue_event
from routing.models import GithubDelivery
from routing.revisions import pull_request_revision

logger = logging.getLogger(__name__)

NOT_CONFIGURED = (
    "GitHub webhooks are not configured (LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE)"
)
SECRET_UNREADABLE = "the webhook secret cannot be read; see the log"
TOO_LARGE = "payload larger than {limit} bytes"
BAD_SIGNATURE = "bad or missing X-Hub-Signature-256"
NO_DELIVERY = "missing X-GitHub-Delivery or X-GitHub-Event"
NOT_JSON = "the payload is not a JSON object: {error}"
DUPLICATE = "duplicate delivery: already handled"
NOT_OURS = "ignored: not a pull request loopsweb opened"


def webhook_secret() -> bytes | None:
    """The secret from LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE (None: not configured);
    EnvFileError when the file is not fit to hold it or has no such line."""
    path = settings.LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE
    if not path:
        return None
    secret = read_env_file(path).get("GITHUB_WEBHOOK_SECRET", "").strip()
    if not secret:
        raise EnvFileError(f"{path} has no GITHUB_WEBHOOK_SECRET= line")
    return secret.encode()


def signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether `header` is GitHub's `sha256=<hex>` of `body` with `secret`."""
    if not header or not header.isascii() or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    given = header.removeprefix("sha256=").strip().encode()
    return hmac.compare_digest(expected, given)


@csrf_exempt
@require_POST
def github_hook(request: HttpRequest) -> JsonResponse:
    """The endpoint (module docstring, in its order)."""
    try:
        secret = webhook_secret()
    except EnvFileError as exc:
        logger.error("GitHub webhook refused: %s", exc)
        return JsonResponse({"error": SECRET_UNREADABLE}, status=503)
    if secret is None:
        return JsonResponse({"error": NOT_CONFIGURED}, status=404)
    limit = int(settings.LOOPSWEB_GITHUB_WEBHOOK_MAX_BYTES)
    body = read_body(request, limit)
    if body is None:
        return JsonResponse({"error": TOO_LARGE.format(limit=limit)}, status=413)
    if not signature_ok(secret, body, request.headers.get("X-Hub-Signature-256")):
        return JsonResponse({"error": BAD_SIGNATURE}, status=401)
    delivery = (request.headers.get("X-GitHub-Delivery") or "").strip()[:100]
    event = (request.headers.get("X-GitHub-Event") or "").strip()[:50]
    if not delivery or not event:
        return JsonResponse({"error": NO_DELIVERY}, status=400)
    try:
        payload = loads_limited(body, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH)
        if not isinstance(payload, dict):
            raise ApplicationError("an object is expected")
    except (ApplicationError, ValueError) as exc:
        return JsonResponse({"error": NOT_JSON.format(error=exc)}, status=400)
    try:
        with transaction.atomic():
            try:
                with transaction.atomic():
                    record = GithubDelivery.objects.create(
                        delivery_id=delivery, event=event
                    )
            except IntegrityError:
                return JsonResponse({"delivery": delivery, "outcome": DUPLICATE})
            outcome = hook_event(event, payload)
            record.outcome = outcome[:2000]
            record.save(update_fields=["outcome"])
    except ApplicationError as exc:  # a payload of the wrong shape: nothing written
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"delivery": delivery, "outcome": outcome})


def hook_event(event: str, payload: dict[str, Any]) -> str:
    """Act on one verified delivery (module docstring); its outcome in one line."""
    action = str(payload.get("action") or "")
    if event == "issues":
        return issue_event(action, payload)
    handler = _HANDLERS.get((event, action))
    if handler is None:
        return f"ignored: {event} {action}".strip()
    return handler(payload)


def _repo(payload: dict[str, Any]) -> str:
    name = obj(payload.get("repository")).get("full_name")
    if not isinstance(name, str) or "/" not in name:
        raise ApplicationError("the payload names no repository.full_name")
    return name


def _pull_number(pull: dict[str, Any]) -> int:
    number = pull.get("number")
    if not isinstance(number, int) or isinstance(number, bool):
        raise ApplicationError("the payload's pull request has no number")
    return number


def _revise(
    payload: dict[str, Any], numbers: list[int], found: Finding, commit: str | None
) -> str:
    outcomes = pull_request_revision(
        _repo(payload),
        numbers,
        found,
        commit=commit,
        delay=float(settings.LOOPSWEB_REVISION_DEBOUNCE_SECONDS),
    )
    return "; ".join(outcomes) or NOT_OURS


def _trusted() -> tuple[str, ...]:
    return tuple(settings.LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS)


def _review(payload: dict[str, Any]) -> str:
    review = obj(payload.get("review"))
    if (refused := author_refusal(review, _trusted())) is not None:
        return refused
    found = review_finding(review)
    if found is None:
        return "ignored: the review requests no changes"
    return _revise(
        payload, [_pull_number(obj(payload.get("pull_request")))], found, None
    )


def _review_comment(payload: dict[str, Any]) -> str:
    comment = obj(payload.get("comment"))
    if (refused := author_refusal(comment, _trusted())) is not None:
        return refused
    found = comment_finding(comment)
    return _revise(
        payload, [_pull_number(obj(payload.get("pull_request")))], found, None
    )


def _check(
    payload: dict[str, Any],
    field: str,
    finding: Callable[[dict[str, Any]], Finding | None],
) -> str:
    """A completed check run or check suite (`field`): a revision request when it failed
    on the commit loopsweb pushed last."""
    check = obj(payload.get(field))
    found = finding(check)
    if found is None:
        return f"ignored: {field} conclusion {check.get('conclusion') or 'none'}"
    return _revise(payload, pull_numbers(check), found, found.source["commit"] or None)


def _pull_closed(payload: dict[str, Any]) -> str:
    pull = obj(payload.get("pull_request"))
    number = _pull_number(pull)
    state = "merged" if pull.get("merged") else "closed"
    items = items_of_pull_request(_repo(payload), number)
    skipped = revisions_skip_waiting(
        items, f"skipped: the pull request #{number} was {state}"
    )
    return f"pull request #{number} {state}: {skipped} waiting revision(s) skipped"


_HANDLERS = {
    ("pull_request_review", "submitted"): _review,
    ("pull_request_review_comment", "created"): _review_comment,
    ("check_run", "completed"): lambda p: _check(p, "check_run", check_run_finding),
    ("check_suite", "completed"): lambda p: _check(
        p, "check_suite", check_suite_finding
    ),
    ("pull_request", "closed"): _pull_closed,
}
