"""
The reactor interfaces fleetd's parts take (treq's C{_types.py}): each
part names the narrowest one it needs; only L{fleetd.tap} resolves the
real reactor.
"""

from __future__ import annotations

from typing import cast

from twisted.internet.interfaces import (
    IReactorCore,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorThreads,
    IReactorTime,
    IReactorUDP,
)


class IHTTPClientReactor(IReactorTCP, IReactorTime, IReactorPluggableNameResolver):
    """
    What an C{Agent} or a C{HostnameEndpoint} needs: resolve a name,
    connect, time out (treq's C{_ITreqReactor}).
    """


class IListenerReactor(IReactorCore, IReactorTime):
    """A listener binds a described endpoint and times its connections."""


class IFleetdReactor(
    IHTTPClientReactor, IListenerReactor, IReactorThreads, IReactorUDP
):
    """The daemon's reactor: everything its parts need from it."""


_PARTS = (
    IReactorCore,
    IReactorTime,
    IReactorTCP,
    IReactorUDP,
    IReactorThreads,
    IReactorPluggableNameResolver,
)


def fleetdReactor(reactor: object) -> IFleetdReactor:
    """
    C{reactor} as an L{IFleetdReactor}, once it provides every interface
    that one combines (Twisted types the global reactor as fewer).

    @raise TypeError: naming the first interface C{reactor} lacks.
    """
    for part in _PARTS:
        if not part.providedBy(reactor):
            raise TypeError(f"{reactor!r} does not provide {part.__name__}")
    return cast(IFleetdReactor, reactor)
