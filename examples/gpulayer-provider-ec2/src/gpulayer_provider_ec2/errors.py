"""EC2's error codes, turned into the typed errors GPUlayer's provisioning acts on.

GPUlayer reads the class, never the message: ``NoCapacity`` and ``QuotaExceeded`` move on
to the next offer (and block this scope for a while), ``SkipOffer`` drops the offer,
``ProviderAuthFailed`` disables the provider with the message shown in ``providers list``,
``ProviderTransient`` tries the same again later.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError, ProfileNotFound

from gpulayer import plugin

AUTH = frozenset({"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
                  "ExpiredToken", "Blocked"})
# this machine's clock is off AWS's: signed requests are refused until it is set right, which
# needs no new credentials and no restart (RequestExpired disabled the provider as if the
# credentials were bad)
CLOCK_SKEW = frozenset({"RequestExpired", "RequestTimeTooSkewed", "RequestInTheFuture"})
CLOCK_HINT = ("(clock skew: the request's time stamp is more than 15 minutes off AWS's clock; check this "
              "machine's clock, e.g. NTP; trying again later)")
NO_CAPACITY = frozenset({"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
                         "InsufficientReservedInstanceCapacity", "InsufficientFreeAddressesInSubnet"})
QUOTA = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
                   "InstanceCreditLimitExceeded"})
# this offer cannot be used here (type not sold in the zone, a bad image or subnet for the
# region, a region the account has not opted in to): another offer may work
SKIP = frozenset({"Unsupported", "InvalidParameterValue", "InvalidParameterCombination", "InvalidParameter",
                  "InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable",
                  "InvalidSubnetID.NotFound", "InvalidGroup.NotFound", "InvalidKeyPair.NotFound",
                  "OptInRequired", "UnsupportedOperation"})
# (PendingVerification: a new account, or a region being enabled, that AWS is still
# verifying; it ends by itself, without new credentials)
TRANSIENT = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError",
                       "InternalFailure", "ServiceUnavailable", "Unavailable", "IncorrectState",
                       "PendingVerification"})
#: what terminate treats as "already gone"
GONE = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


def code_of(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def mapped(exc: Exception, where: str) -> plugin.ProviderError:
    """The typed error for an exception boto3 raised while doing something in ``where``."""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return plugin.ProviderAuthFailed(f"{where}: no usable AWS credentials ({exc}); set them the way boto3 "
                                         "reads them (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, "
                                         "an instance role) or name a profile with 'profile'")
    if isinstance(exc, ProfileNotFound):
        return plugin.ProviderAuthFailed(f"{where}: {exc}; the 'profile' key names a profile of ~/.aws/config")
    if isinstance(exc, BotoCoreError):  # could not connect, timed out, ...
        return plugin.ProviderTransient(f"{where}: {exc}")
    if not isinstance(exc, ClientError):
        return plugin.ProviderTransient(f"{where}: {type(exc).__name__}: {exc}")
    code = code_of(exc)
    message = f"{where}: {code}: {exc.response.get('Error', {}).get('Message', '')}".rstrip(": ")
    kind: type[plugin.ProviderError]
    if code in CLOCK_SKEW:
        return plugin.ProviderTransient(f"{message} {CLOCK_HINT}")
    if code in AUTH:
        kind = plugin.ProviderAuthFailed
    elif code in NO_CAPACITY:
        kind = plugin.NoCapacity
    elif code in QUOTA:
        kind = plugin.QuotaExceeded
    elif code in SKIP:
        kind = plugin.SkipOffer
    elif code in TRANSIENT or code.endswith(".Unavailable"):
        kind = plugin.ProviderTransient
    else:
        kind = plugin.ProviderError  # not one GPUlayer can act on specifically
    return kind(message)
