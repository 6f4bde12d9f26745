"""The online controller: estimates (acceptance, cost) -> decision (drafter, k) every step."""
