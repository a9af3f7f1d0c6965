"""The cancellation campaign: each public operation cancelled at its 1st, 2nd, ... Nth
checkpoint (see `checkpoints`), until it completes without meeting the cancellation.

After every attempt, and once whatever the attempt opened is closed again:
- the operation raised the cancellation, or returned because the rest of it was shielded;
- the provider objects carrying the run's owner label are exactly those that were there
  before the attempt (the campaign's own live session, or none);
- no thread started during the attempt is still at work (idle pool workers may stay);
- no corral temporary entry appeared in tempfile's directory or beside a download's
  destination, and a download's destination is either absent or the whole tree;
- a cancelled `exec` stopped its command within `PROMPT_S`, and no process it started is
  alive on the host;
- after a cancelled `set_network_policy`, the policy the session reports is the old one or
  no network (the new one only where the switch ran to its end), and connecting to two
  host listeners shows exactly that policy (never the union, never a mix), unless the
  switch closed the session.

`run_campaign(subject, operation)` runs one operation against a `Subject` (the provider,
a plan, and the means to see what it left); `markdown(reports)` is the summary table.
Run it with tempfile's directory private to the campaign (the tests do), so that other
users of corral on the host cannot count as its leaks.
"""

from corral.testing.campaign.cases import OPERATIONS, PROMPT_S, reaches
from corral.testing.campaign.report import markdown
from corral.testing.campaign.run import LEAKS, Problem, Report, run_campaign
from corral.testing.campaign.subject import Subject

__all__ = [
    "LEAKS",
    "OPERATIONS",
    "PROMPT_S",
    "Problem",
    "Report",
    "Subject",
    "markdown",
    "reaches",
    "run_campaign",
]
