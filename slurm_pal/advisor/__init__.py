"""The live advisor: what job_submit.lua asks at submit time, the service that answers, and
the job records the Prolog/Epilog send back. PROTOCOL.md is the contract between them."""
