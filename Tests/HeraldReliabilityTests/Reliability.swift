// Issue #10's proofs: whole-process fault injection, hostile clients and security checks. Each file holds one
// kind of scenario; they run real Redis, Tansu, herald-apns-sim and both services as processes.
