TITLE Five-state NMDA receptor with a magnesium block procedure

COMMENT
Written for kingen's tests in the style of Destexhe-type NMDA files on ModelDB (not a copy
of one): a PROCEDURE computes the magnesium block B from the membrane potential with unit
annotations inside its expression, and B multiplies the conductance in BREAKPOINT.
ENDCOMMENT

NEURON {
    POINT_PROCESS NMDA5
    RANGE Rb, Ru, Rd, Rr, Ro, Rc, g, gmax, mg, B
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
    gmax = 50 (pS)
    mg = 1 (mM)
    Rb = 5 (/mM /ms)
    Ru = 0.0129 (/ms)
    Rd = 0.0084 (/ms)
    Rr = 0.0068 (/ms)
    Ro = 0.0465 (/ms)
    Rc = 0.0738 (/ms)
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    C (mM)
    B (1)
}

STATE { C0 C1 C2 D O }

INITIAL {
    C0 = 1
}

BREAKPOINT {
    SOLVE kstates METHOD sparse
    mgblock(v)
    g = gmax * B * O
    i = (1e-6) * g * (v - Erev)
}

KINETIC kstates {
    ~ C0 <-> C1 (Rb*C, Ru)
    ~ C1 <-> C2 (Rb*C, Ru)
    ~ C2 <-> D  (Rd, Rr)
    ~ C2 <-> O  (Ro, Rc)
    CONSERVE C0 + C1 + C2 + D + O = 1
}

PROCEDURE mgblock(v(mV)) {
    B = 1 / (1 + exp(0.062 (/mV) * -v) * (mg / 3.57 (mM)))
}
