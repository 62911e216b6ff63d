TITLE Four-state AMPA receptor with Q10 factors computed in INITIAL

COMMENT
Written for kingen's tests in the style of published ModelDB synapse files (not a copy of
one): the binding and the gating rates carry their own Q10, applied as factors that
INITIAL computes from NEURON's celsius. Rates hold at 22 degC.
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPA4Q
    RANGE kon, koff, beta, alpha, d, r, Q10_binding, Q10_gating, g, gmax
    NONSPECIFIC_CURRENT i
    RANGE C
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
}

PARAMETER {
    Erev = 0 (mV)
    gmax = 10 (pS)
    Q10_binding = 2.4
    Q10_gating = 3.0
    kon = 5 (/mM /ms)      : binding
    koff = 2 (/ms)         : unbinding
    beta = 4 (/ms)         : opening
    alpha = 1 (/ms)        : closing
    d = 0.2 (/ms)          : desensitization
    r = 0.01 (/ms)         : recovery
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    C (mM)
    celsius (degC)
    qb (1)
    qg (1)
}

STATE { C0 C1 O D }

INITIAL {
    qb = Q10_binding^((celsius - 22 (degC))/10 (degC))
    qg = Q10_gating^((celsius - 22)/10)
    SOLVE kin STEADYSTATE sparse
}

BREAKPOINT {
    SOLVE kin METHOD sparse
    g = gmax * O
    i = (1e-6) * g * (v - Erev)
}

KINETIC kin {
    ~ C0 <-> C1 (qb*kon*C, qb*koff)
    ~ C1 <-> O  (qg*beta, qg*alpha)
    ~ O  <-> D  (d, r)
    CONSERVE C0 + C1 + O + D = 1
}
