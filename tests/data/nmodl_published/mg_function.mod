TITLE Three-state NMDA receptor whose current a magnesium-block FUNCTION multiplies

COMMENT
Written for kingen's tests in the style of published ModelDB files (not a copy of one): the
conductance comes from the open state alone; a FUNCTION B(v) of the membrane potential
multiplies it in the current.
ENDCOMMENT

NEURON {
    POINT_PROCESS NMDA3B
    RANGE kon, koff, beta, alpha, g, gmax, mg
    NONSPECIFIC_CURRENT i
    RANGE T
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
}

PARAMETER {
    Erev = 0 (mV)
    gmax = 40 (pS)
    mg = 1.2 (mM)
    kon = 2 (/mM /ms)
    koff = 0.05 (/ms)
    beta = 0.1 (/ms)
    alpha = 0.2 (/ms)
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    T (mM)
}

STATE { R RT O }

BREAKPOINT {
    SOLVE kin METHOD sparse
    g = gmax * O
    i = (1e-6) * g * B(v) * (v - Erev)
}

KINETIC kin {
    ~ R  <-> RT (kon*T, koff)
    ~ RT <-> O  (beta, alpha)
    CONSERVE R + RT + O = 1
}

FUNCTION B(v (mV)) {
    B = 1 / (1 + exp(0.062 (/mV) * -v) * (mg / 3.57 (mM)))
}
